"""A token that changes with everything a balancer's topology snapshot reads.

Every balancer re-reads its topology every ``MERIDIAN_TOPOLOGY_REFRESH_S`` (2 s), so
that a replica added, drained or failed over, a key issued or revoked, or a policy
changed reaches the request path within seconds.  A full read is seven queries and
their rows' objects (about 3 ms of CPU), and in a quiet region nothing has changed.
So each refresh first reads one row, ``TopologyChange``; only when its token differs
from the one read before the snapshot does the balancer load the rest
(``routing.topology.refresh_snapshot``).

The token is redrawn (not incremented) by the saves and deletes of the models below
when they touch a field in ``SNAPSHOT_FIELDS``: a random draw never repeats a value a
balancer holds, even after the table is emptied and the row recreated.  Saves that
touch only other fields (a probe's ``last_probe_at``, a heartbeat's
``last_heartbeat``, the autoscaler's ``scaling_state``, a key's usage) leave it
alone, so a busy control plane does not turn every refresh into a full one.

Writes that bypass the ORM's signals (``QuerySet.update``, raw SQL, another tool)
are not seen: the project's own code saves rows instead, and a writer that cannot
calls ``topology_changed()``.  Anything else is caught by the balancer's periodic full
read (``MERIDIAN_TOPOLOGY_FULL_REFRESH_S``).
"""

from __future__ import annotations

import secrets
from typing import Any

from django.db import models
from django.db.models.signals import post_delete, post_save

from fleet.models import (
    ApiKey,
    Balancer,
    Region,
    RegionLatency,
    Replica,
    ServiceConfig,
    TopologyChange,
    Zone,
)

ROW = 1
# Per model, the fields ``routing.topology.load_snapshot`` reads (filters included).
# tests/fleet/test_topology_change.py changes every other field of every model and
# checks that the snapshot stays the same.
SNAPSHOT_FIELDS: dict[type[models.Model], frozenset[str]] = {
    Region: frozenset({"name"}),
    Zone: frozenset({"name"}),
    RegionLatency: frozenset({"source", "target", "rtt_ms"}),
    Balancer: frozenset({"name", "region", "url"}),
    Replica: frozenset(
        {"name", "url", "model_name", "region", "zone", "kind", "state", "balancer"}
    ),
    ServiceConfig: frozenset(
        {"model_name", "policy", "policy_params", "queue_max_len", "queue_max_wait_s"}
    ),
    ApiKey: frozenset(
        {
            "key_hash",
            "prefix",
            "revoked",
            "requests_per_minute",
            "tokens_per_minute",
            "max_concurrent",
            "token_budget",
            "budget_period",
            "allowed_models",
        }
    ),
}


def topology_changed() -> None:
    """Draw a new token (in the caller's transaction, if any: it commits with the change)."""
    token = secrets.randbits(63)
    if not TopologyChange.objects.filter(pk=ROW).update(token=token):
        TopologyChange.objects.update_or_create(pk=ROW, defaults={"token": token})


def current_token() -> int | None:
    """The token now; None when the row is missing (every refresh then reads in full)."""
    return TopologyChange.objects.filter(pk=ROW).values_list("token", flat=True).first()


def touches_snapshot(model: type[models.Model], update_fields: frozenset[str] | None) -> bool:
    """Whether a save with these ``update_fields`` (None: every field) may change a snapshot."""
    if update_fields is None:
        return True
    # update_fields may name a foreign key by its attname (``region_id``).
    names = {model._meta.get_field(name).name for name in update_fields}
    return not names.isdisjoint(SNAPSHOT_FIELDS[model])


def _saved(sender: type[models.Model], created: bool, update_fields: Any, **_: Any) -> None:
    if created or touches_snapshot(sender, update_fields):
        topology_changed()


def _deleted(sender: type[models.Model], **_: Any) -> None:
    topology_changed()


def connect() -> None:
    for model in SNAPSHOT_FIELDS:
        post_save.connect(_saved, sender=model, dispatch_uid=f"topology-change-save-{model}")
        post_delete.connect(_deleted, sender=model, dispatch_uid=f"topology-change-del-{model}")
