"""The runtime's topology refresh: one row while the topology token stands, every table
when it moved (or when the periodic full read is due), and both counted in /metrics."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from fleet.models import ApiKey
from routing.runtime import BalancerRuntime
from tests.support.inprocess import balancer_config
from tests.support.rows import Rows


def _reads(runtime: BalancerRuntime) -> tuple[float, float]:
    reads = runtime.metrics.topology_reads
    return reads.value("full"), reads.value("checked")


@pytest.mark.django_db(transaction=True)
def test_a_refresh_reads_every_table_only_when_the_token_moved_or_a_full_read_is_due() -> None:
    rows = Rows()
    us = rows.region("us-east")
    rows.balancer("us-lb", us)
    rows.replica("us-r1", us)

    async def scenario(full_every_s: float) -> list[tuple[float, float]]:
        config = balancer_config(balancer="us-lb", topology_full_refresh_s=full_every_s)
        runtime = BalancerRuntime(config, asyncio.get_running_loop())
        seen = []
        try:
            for step in ("first", "quiet", "key issued", "quiet"):
                if step == "key issued":
                    await database_sync_to_async(ApiKey.issue)("team")
                await runtime.refresh_topology(raise_errors=True)
                seen.append(_reads(runtime))
            assert runtime.snapshot is not None
            assert len(runtime.snapshot.api_key_hashes) >= 1
        finally:
            await runtime.close()
        return seen

    # (full, checked) after each refresh: the first reads everything, a quiet one reads
    # the token, the issued key moves it.
    assert asyncio.run(scenario(3600.0)) == [(1, 0), (1, 1), (2, 1), (2, 2)]
    # A full read due at every refresh: the token is not even looked at.
    assert asyncio.run(scenario(0.0)) == [(1, 0), (2, 0), (3, 0), (4, 0)]
