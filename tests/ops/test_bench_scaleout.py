"""``manage.py bench scaleout``: its options are checked, and its Redis-cost table times
real exchanges against the test Redis (the process tables are run by hand: they start
whole stacks)."""

from __future__ import annotations

import io

import pytest

from ops.bench.scaleout import redis_cost_table, run
from ops.embedded_redis import EmbeddedRedis


def test_the_process_counts_must_start_with_the_single_process_baseline() -> None:
    with pytest.raises(ValueError, match="must start with 1"):
        run({"processes": "2,4"}, io.StringIO())


def test_the_redis_cost_table_times_one_exchange_per_batch_size(
    redis_server: EmbeddedRedis,
) -> None:
    text = redis_cost_table(exchanges=5)
    rows = [line.split() for line in text.splitlines()[2:] if line.strip()]
    assert [row[0] for row in rows] == ["1", "8", "32"]
    for row in rows:
        assert row[1] == "5"  # every timed exchange succeeded
        trip, whole = float(row[2]), float(row[4])
        assert 0 < trip <= whole
