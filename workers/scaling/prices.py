"""Hourly prices per zone: configured, or the mean of AWS spot price history files.

Reads ``aws ec2 describe-spot-price-history`` JSON (``SpotPriceHistory[]`` with
``AvailabilityZone``, ``InstanceType``, ``SpotPrice``) from every ``*.json`` under a
folder, e.g. the 2020 multi-region logs (``logs/aws/cost`` of
github.com/stanford-futuredata/training_on_a_dime).
SkyServe §2.1 notes spot prices are "generally stable over time" with differences across
zones, so a per-zone mean is what placement compares.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# AWS us-east-1 on-demand list prices, USD per hour (what the 2020 logs' instances cost).
ON_DEMAND_LIST_PRICE = {
    "p2.xlarge": 0.90,
    "p2.8xlarge": 7.20,
    "p2.16xlarge": 14.40,
    "p3.2xlarge": 3.06,
    "p3.8xlarge": 12.24,
    "p3.16xlarge": 24.48,
}


def load_aws_spot_prices(folder: str | Path, instance_type: str) -> dict[str, float]:
    """Mean spot price per availability zone for ``instance_type`` (Linux/UNIX)."""
    samples: dict[str, list[float]] = defaultdict(list)
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            history = json.loads(path.read_text()).get("SpotPriceHistory", [])
        except (json.JSONDecodeError, AttributeError):
            continue  # the logs hold a few empty results for instances a region lacks
        for row in history:
            if row.get("InstanceType") == instance_type and "Linux" in row.get(
                "ProductDescription", "Linux"
            ):
                samples[row["AvailabilityZone"]].append(float(row["SpotPrice"]))
    return {zone: sum(values) / len(values) for zone, values in samples.items() if values}
