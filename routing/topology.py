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

A refresh (``refresh_snapshot``) first reads the topology token
(``fleet.topology_change``) and reads the tables only when it moved since the
snapshot, or when the runtime asks for its periodic full read.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from channels.db import database_sync_to_async
from django.db.models import Q

from core.availability import (
    PUSH_BUDGET_KEY,
    PUSHING_KEY,
    PushingConfig,
    split_pushing_params,
)
from core.key_limits import NO_LIMITS, KeyLimits
from core.registry import default_pushing
from core.topology import ModelSpec, PeerSpec, ReplicaSpec, TopologySnapshot
from fleet.models import ApiKey, Balancer, RegionLatency, Replica, ServiceConfig
from fleet.topology_change import current_token

logger = logging.getLogger(__name__)
PUSHING_KEYS = (PUSHING_KEY, PUSH_BUDGET_KEY)
# Bad pushing settings already logged (bounded by the distinct configurations seen).
_reported: set[tuple[str, str]] = set()


class BalancerNotConfiguredError(LookupError):
    pass


def load_snapshot(balancer_name: str) -> TopologySnapshot:
    # Taken before the first read: the snapshot holds every row committed by then
    # (a drill waits on it to know that each process has learned a key it issued).
    loaded_at = time.time()
    # Read before the rows: a change committed after this read redraws the token, so
    # the next refresh reads it even if these reads already saw it.
    change_token = current_token()
    try:
        me = Balancer.objects.select_related("region").get(name=balancer_name)
    except Balancer.DoesNotExist:
        raise BalancerNotConfiguredError(
            f"MERIDIAN_BALANCER={balancer_name!r} names no Balancer in the database"
        ) from None
    routable = Replica.objects.filter(state__in=Replica.ROUTABLE_STATES)
    owned = routable.filter(Q(balancer=me) | Q(balancer__isnull=True, region=me.region))
    rtt = _rtt_by_region(me)
    replicas = tuple(
        ReplicaSpec(
            name=r.name,
            url=r.url,
            model=r.model_name,
            region=r.region.name,
            zone=r.zone.name,
            kind=r.kind,
            # A replica owned across regions (failover) is that region's RTT away.
            rtt_ms=0.0 if r.region_id == me.region_id else rtt.get(r.region_id, 0.0),
        )
        for r in owned.select_related("region", "zone").order_by("name")
    )
    models = {c.model_name: model_spec(c) for c in ServiceConfig.objects.all()}
    live_models = set(routable.values_list("model_name", flat=True).distinct())
    keys = list(ApiKey.objects.filter(revoked=False))
    return TopologySnapshot(
        balancer=me.name,
        region=me.region.name,
        url=me.url,
        replicas=replicas,
        peers=_peers(me, rtt),
        models=models,
        served_models=frozenset(m for m in models if m in live_models),
        api_key_hashes=frozenset(k.key_hash for k in keys),
        key_limits={k.key_hash: _limits_or_none(k) for k in keys},
        key_labels={k.key_hash: k.prefix for k in keys},
        loaded_at=loaded_at,
        change_token=change_token,
    )


def refresh_snapshot(
    balancer_name: str, current: TopologySnapshot | None, *, full: bool
) -> tuple[TopologySnapshot, bool]:
    """The topology now, and whether it was read in full.

    One query when nothing has changed since ``current`` was read (its token still
    stands): ``current`` comes back re-dated, since every row committed before the
    check is in it.  Otherwise, or when ``full`` is asked (the periodic read that
    catches writes no signal saw), every table is read again."""
    if full or current is None or current.change_token is None:
        return load_snapshot(balancer_name), True
    checked_at = time.time()
    if current_token() != current.change_token:
        return load_snapshot(balancer_name), True
    return dataclasses.replace(current, loaded_at=checked_at), False


def _limits_or_none(key: ApiKey) -> KeyLimits:
    """A key's limits; values that fail validation (a hand-edited row) are logged once and
    the key served without limits, as a bad policy falls back to least-load."""
    try:
        return key.limits()
    except ValueError as exc:
        if (key.prefix, str(exc)) not in _reported:
            _reported.add((key.prefix, str(exc)))
            logger.error("API key %s: %s; serving it without limits", key.prefix, exc)
        return NO_LIMITS


def model_spec(config: ServiceConfig) -> ModelSpec:
    """A ServiceConfig as the router sees it: the pushing keys split off the policy's
    parameters (a bad value is logged and the policy's default rule used: a typo
    must not take a model offline), and the regional queue's bounds.  A service
    naming no pushing rule gets its policy's (``default_pushing``: ``tokens`` for
    the cost model)."""
    params = dict(config.policy_params or {})
    try:
        pushing, policy_params = split_pushing_params(params, default_pushing(config.policy))
    except ValueError as exc:
        if (config.model_name, str(exc)) not in _reported:  # once, not every refresh
            _reported.add((config.model_name, str(exc)))
            logger.error("service %s: %s; using SP-P pushing", config.model_name, exc)
        policy_params = {k: v for k, v in params.items() if k not in PUSHING_KEYS}
        pushing = PushingConfig(default_pushing(config.policy))
    return ModelSpec(
        config.model_name,
        config.policy,
        policy_params,
        pushing=pushing,
        queue_max_len=config.queue_max_len,
        queue_max_wait_s=config.queue_max_wait_s,
    )


def _rtt_by_region(me: Balancer) -> dict[int, float]:
    """RTT in ms from this balancer's region to each region with a RegionLatency row."""
    rtt: dict[int, float] = {}
    pairs = RegionLatency.objects.filter(Q(source=me.region) | Q(target=me.region))
    for pair in pairs:
        other = pair.target_id if pair.source_id == me.region_id else pair.source_id
        # A row measured from this region wins over the reverse pair, in either order.
        if pair.source_id == me.region_id or other not in rtt:
            rtt[other] = pair.rtt_ms
    return rtt


def _peers(me: Balancer, rtt: dict[int, float]) -> tuple[PeerSpec, ...]:
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
refresh_snapshot_async = database_sync_to_async(refresh_snapshot)
