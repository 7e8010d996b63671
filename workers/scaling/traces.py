"""Spot capacity over time: SkyPilot spot traces read by path, or a Poisson model.

Trace files are SkyPilot's ``spot-traces`` format: ``{"metadata": {"gap_seconds": G},
"data": [v0, v1, ...]}``, one file per zone named ``<zone>_<instance>_<count>.json``,
``data[i]`` holding for ``[i·G, (i+1)·G)``.  Multi-node files hold how many instances
could be kept (0..N): that is the zone's spot capacity.  The 1-node files are binary;
we read **1 = spot obtainable, 0 = unavailable/preempted** (upstream README: "number of
available instances"), and checked it against SkyServe's own numbers: the share of ones
in the 2-month p3.2xlarge trace ranges from 16.7 % (us-east-1a) to 90.5 % (us-west-2b),
exactly Figure 4a's "spot GPUs 16.7 %-90.4 % available", and the GCP c3-88 CPU files
are 95.4-99.98 % ones, Figure 4b's "spot CPUs 95.6 %-99.9 %".  The inverted reading
would make a CPU spot market 0-5 % available.  A binary zone that is up has unbounded
capacity (the trace kept one instance; we assume more would have launched too).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

UNBOUNDED = 1_000_000


@dataclass(frozen=True)
class SpotTrace:
    """Per-zone spot capacity sampled every ``gap_s`` seconds from t = 0."""

    name: str
    gap_s: float
    zones: Mapping[str, Sequence[int]]
    binary: bool

    @property
    def duration_s(self) -> float:
        return self.gap_s * min(len(v) for v in self.zones.values())

    def capacity(self, zone: str, t: float) -> int:
        series = self.zones.get(zone)
        if series is None:
            return UNBOUNDED  # a zone the trace does not cover is never short of spot
        value = series[min(len(series) - 1, max(0, int(t // self.gap_s)))]
        if self.binary:
            return UNBOUNDED if value > 0 else 0
        return value


def _zone_and_instance(path: Path) -> tuple[str, str]:
    zone, _, instance = path.stem.partition("_")
    return zone, instance or "spot"


EXPECTED = '{"metadata": {"gap_seconds": G}, "data": [capacity, ...]} (SkyPilot spot trace)'


def _series(path: Path) -> tuple[float, list[int]]:
    try:
        doc = json.loads(path.read_text())
        return float(doc["metadata"]["gap_seconds"]), [int(v) for v in doc["data"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a spot trace; expected {EXPECTED} ({exc})") from exc


def _build(name: str, files: Sequence[Path]) -> SpotTrace:
    gaps: set[float] = set()
    zones: dict[str, list[int]] = {}
    for path in sorted(files):
        gap, values = _series(path)
        gaps.add(gap)
        zones[_zone_and_instance(path)[0]] = values
    if len(gaps) != 1:
        raise ValueError(f"{name}: zones sampled at different gaps {sorted(gaps)}")
    binary = all(v in (0, 1) for series in zones.values() for v in series)
    return SpotTrace(name=name, gap_s=gaps.pop(), zones=zones, binary=binary)


def load_traces(path: str | Path) -> list[SpotTrace]:
    """A file is a one-zone trace; a folder is one trace per instance type in it,
    its zones being the files that share that instance suffix."""
    root = Path(path)
    if root.is_file():
        return [_build(root.stem, [root])]
    groups: dict[str, list[Path]] = {}
    for file in sorted(root.glob("*.json")):
        groups.setdefault(_zone_and_instance(file)[1], []).append(file)
    if not groups:
        raise ValueError(f"{root}: no *.json spot traces")
    return [_build(f"{root.name}/{instance}", files) for instance, files in groups.items()]


@dataclass(frozen=True)
class PoissonSpotModel:
    """Per-zone preemptions as a Poisson process (SkyServe §3.1's λ_i model): each
    preemption makes the zone unobtainable for an exponential outage of mean
    ``mean_outage_s``.  Rendered into a binary ``SpotTrace`` so both sources replay
    through the same code."""

    preemptions_per_hour: Mapping[str, float]
    mean_outage_s: float = 900.0
    seed: int = 0

    def render(self, duration_s: float, gap_s: float = 30.0) -> SpotTrace:
        rng = random.Random(self.seed)
        steps = max(1, int(duration_s // gap_s))
        zones = {
            zone: self._zone(rng, rate, steps, gap_s)
            for zone, rate in self.preemptions_per_hour.items()
        }
        return SpotTrace(name=f"poisson-seed{self.seed}", gap_s=gap_s, zones=zones, binary=True)

    def _zone(
        self, rng: random.Random, rate_per_hour: float, steps: int, gap_s: float
    ) -> list[int]:
        values = [1] * steps
        t = 0.0
        horizon = steps * gap_s
        while rate_per_hour > 0:
            t += rng.expovariate(rate_per_hour / 3600.0)
            if t >= horizon:
                break
            end = t + rng.expovariate(1.0 / self.mean_outage_s)
            for i in range(int(t // gap_s), min(steps, int(end // gap_s) + 1)):
                values[i] = 0
            t = end
        return values
