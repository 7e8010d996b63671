"""Create the proxy benchmark's throwaway database: schema plus one region's topology.

Run as a child (``python -m ops.bench.seed SPEC_JSON``) with ``DATABASE_URL``
pointing at a fresh SQLite file, so the command that starts the benchmark never
touches its own database.  Prints one JSON line: the raw API key and the policy
the service got.

The topology is the smallest one that engages the whole routing core: one
region, one balancer, the replicas given (ready, owned by that balancer), a
``ServiceConfig`` for the model with the prefix-aware policy when the registry
has it (``skylb``), else ``least_load``, and the pushing mode asked for, and
one API key.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

PREFERRED_POLICIES = ("skylb", "least_load")


@dataclass(frozen=True, slots=True)
class SeedSpec:
    balancer: str
    balancer_url: str
    model: str
    replica_urls: list[str]
    policy: str = ""  # empty: the first of PREFERRED_POLICIES the registry knows
    pushing: str = ""  # ServiceConfig's "pushing" mode (sp-p, sp-o, blind); empty: default


def choose_policy(requested: str, known: list[str]) -> str:
    """The policy to configure: the one asked for, else the preferred one available."""
    if requested:
        if requested not in known:
            raise ValueError(f"unknown policy {requested!r}; known: {', '.join(known)}")
        return requested
    return next(name for name in PREFERRED_POLICIES if name in known)


def seed(spec: SeedSpec) -> dict[str, Any]:
    """Migrate the (empty) database and write the topology rows; returns key and policy."""
    from django.core.management import call_command

    from core.registry import policy_names
    from fleet.models import ApiKey, Balancer, Region, Replica, ServiceConfig, Zone

    call_command("migrate", verbosity=0, interactive=False)
    policy = choose_policy(spec.policy, policy_names())
    region = Region.objects.create(name="bench")
    zone = Zone.objects.create(region=region, name="bench-1")
    balancer = Balancer.objects.create(name=spec.balancer, region=region, url=spec.balancer_url)
    for index, url in enumerate(spec.replica_urls):
        Replica.objects.create(
            name=f"bench-r{index}",
            url=url,
            model_name=spec.model,
            region=region,
            zone=zone,
            balancer=balancer,
            state=Replica.State.READY,
        )
    params = {"pushing": spec.pushing} if spec.pushing else {}
    ServiceConfig.objects.create(model_name=spec.model, policy=policy, policy_params=params)
    _, raw_key = ApiKey.issue("bench")
    return {"api_key": raw_key, "policy": policy}


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "meridian.settings")
    import django

    django.setup()
    spec = SeedSpec(**json.loads(argv[0]))
    sys.stdout.write(json.dumps(seed(spec)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
