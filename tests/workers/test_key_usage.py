"""Per-key usage rolled up from Redis onto the ApiKey rows (admin, console)."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings

from core.key_limits import usage_key
from fleet.models import ApiKey
from ops.embedded_redis import EmbeddedRedis
from workers.key_usage import rollup_key_usage

pytestmark = pytest.mark.django_db


def test_usage_totals_reach_the_rows_and_never_go_down(redis_server: EmbeddedRedis) -> None:
    used, idle = ApiKey.issue("used")[0], ApiKey.issue("idle")[0]
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.hset(
            usage_key(used.key_hash),
            mapping={
                "requests": 3,
                "prompt_tokens": 30,
                "cached_tokens": 16,
                "completion_tokens": 9,
            },
        )
        result = rollup_key_usage(client)
        assert (result.keys, result.updated) == (2, 1)
        used.refresh_from_db()
        idle.refresh_from_db()
        assert (used.usage_requests, used.usage_prompt_tokens) == (3, 30)
        assert (used.usage_cached_tokens, used.usage_completion_tokens) == (16, 9)
        assert used.usage_updated_at is not None and idle.usage_updated_at is None
        # Redis lost its data: the rows keep what they showed.
        client.delete(usage_key(used.key_hash))
        assert rollup_key_usage(client).updated == 0
        used.refresh_from_db()
        assert used.usage_requests == 3
    finally:
        client.delete(usage_key(used.key_hash), usage_key(idle.key_hash))
        client.close()
