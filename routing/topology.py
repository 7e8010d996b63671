"""Read this balancer's topology from the database into a ``TopologySnapshot``.

This is the only place the balancer touches the ORM, and it runs in the
background (``BalancerRuntime``'s refresh loop, through
``database_sync_to_async``, which also closes stale connections as a request
would), never on the request path.

What a balancer owns: replicas whose ``balancer`` is this one (failover hands a
dead region's replicas to a live balancer), plus replicas of its own region with
no owner, all in a routable state (only ``ready``).  Peers are every other
balancer, with the RTT from this region (either direction of RegionLatency,
since operators often enter a pair once).
"""

from __future__ import annotations

import math
import time

from channels.db import database_sync_to_async
from django.db.models import Q

from console.models import ApiKey, Balancer, RegionLatency, Replica, ServiceConfig
from routing.core.topology import ModelSpec, PeerSpec, ReplicaSpec, TopologySnapshot


class BalancerNotConfiguredError(LookupError):
    pass


def load_snapshot(balancer_name: str) -> TopologySnapshot:
    try:
        me = Balancer.objects.select_related("region").get(name=balancer_name)
    except Balancer.DoesNotExist:
        raise BalancerNotConfiguredError(
            f"MERIDIAN_BALANCER={balancer_name!r} names no Balancer in the database"
        ) from None
    routable = Replica.objects.filter(state__in=Replica.ROUTABLE_STATES)
    owned = routable.filter(Q(balancer=me) | Q(balancer__isnull=True, region=me.region))
    replicas = tuple(
        ReplicaSpec(
            name=r.name,
            url=r.url,
            model=r.model_name,
            region=r.region.name,
            zone=r.zone.name,
            kind=r.kind,
        )
        for r in owned.select_related("region", "zone").order_by("name")
    )
    models = {
        c.model_name: ModelSpec(c.model_name, c.policy, dict(c.policy_params or {}))
        for c in ServiceConfig.objects.all()
    }
    live_models = set(routable.values_list("model_name", flat=True).distinct())
    return TopologySnapshot(
        balancer=me.name,
        region=me.region.name,
        url=me.url,
        replicas=replicas,
        peers=_peers(me),
        models=models,
        served_models=frozenset(m for m in models if m in live_models),
        api_key_hashes=frozenset(
            ApiKey.objects.filter(revoked=False).values_list("key_hash", flat=True)
        ),
        loaded_at=time.time(),
    )


def _peers(me: Balancer) -> tuple[PeerSpec, ...]:
    rtt: dict[int, float] = {}
    pairs = RegionLatency.objects.filter(Q(source=me.region) | Q(target=me.region))
    for pair in pairs:
        other = pair.target_id if pair.source_id == me.region_id else pair.source_id
        # A row measured from this region wins over the reverse pair, in either order.
        if pair.source_id == me.region_id or other not in rtt:
            rtt[other] = pair.rtt_ms
    others = Balancer.objects.exclude(pk=me.pk).select_related("region").order_by("name")
    return tuple(
        PeerSpec(
            name=b.name,
            url=b.url,
            region=b.region.name,
            rtt_ms=0.0 if b.region_id == me.region_id else rtt.get(b.region_id, math.inf),
        )
        for b in others
    )


load_snapshot_async = database_sync_to_async(load_snapshot)
