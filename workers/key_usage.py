"""Per-key usage from Redis into the database: ``ApiKey.usage_*``.

Balancers count each key's requests and prompt, cached and completion tokens in one
Redis hash per key (``core.key_limits.usage_key``: totals since the key was
issued, added atomically by every balancer process of every region).  This pass
copies those totals onto the ``ApiKey`` rows for the admin and the console: one
pipelined round trip for every key, then one UPDATE per key whose counts changed.
Totals never go down: a Redis that lost its data (no persistence, a flush) leaves
the rows at what they last showed rather than zeroing them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from django.utils import timezone

from core.key_limits import USAGE_FIELDS, usage_key
from fleet.models import ApiKey

logger = logging.getLogger(__name__)

MODEL_FIELDS = {
    "requests": "usage_requests",
    "prompt_tokens": "usage_prompt_tokens",
    "cached_tokens": "usage_cached_tokens",
    "completion_tokens": "usage_completion_tokens",
}


@dataclass(frozen=True)
class UsageRollup:
    keys: int
    updated: int


def rollup_key_usage(client: redis.Redis) -> UsageRollup:
    keys = list(ApiKey.objects.all())
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(usage_key(key.key_hash))
    replies = pipe.execute()
    updated = 0
    now = timezone.now()
    for key, raw in zip(keys, replies, strict=True):
        counts = {name: int(raw.get(name.encode(), 0)) for name in USAGE_FIELDS}
        changes = {
            MODEL_FIELDS[name]: value
            for name, value in counts.items()
            if value > getattr(key, MODEL_FIELDS[name])
        }
        if changes:
            ApiKey.objects.filter(pk=key.pk).update(usage_updated_at=now, **changes)
            updated += 1
    return UsageRollup(len(keys), updated)
