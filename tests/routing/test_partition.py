"""The partition fault (``drill_partition``'s injection), in process.

While a peer is partitioned, forwards to it fail before a byte is sent (the request
moves on to the next peer) and polls of it fail as unreachable; the fault expires
on its own at ``until``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from core.topology import PeerSpec
from routing.transport import PeerPartition
from tests.support.inprocess import proxy_call
from tests.support.upstreams import Upstreams

pytestmark = pytest.mark.anyio

PEERS = (PeerSpec("far", "http://far", "ap", 150.0), PeerSpec("near", "http://near", "eu", 80.0))


async def test_a_partitioned_peer_is_skipped_and_the_next_one_serves(build_runtime: Any) -> None:
    upstreams = Upstreams()
    rt = await build_runtime(upstreams, replicas=(), peers=PEERS)
    rt.partition.set(["near"], time.time() + 60)
    response = await rt.dispatcher.dispatch(proxy_call())
    assert response.status_code == 200 and upstreams.hosts() == ["far"]
    assert rt.metrics.upstream_errors.value("near", "network") == 1
    assert rt.inflight() == 0


async def test_polls_of_a_partitioned_peer_fail_until_it_heals(build_runtime: Any) -> None:
    rt = await build_runtime(Upstreams(), replicas=(), peers=PEERS)
    rt.partition.set(["near"], time.time() + 60)
    await rt.poller.poll_all()
    assert "partitioned" in rt.poller.last_errors["near"]
    # The loopback peers answer no valid report (404), but "far" was reached.
    assert "partitioned" not in rt.poller.last_errors["far"]
    rt.partition.set([], 0.0)
    await rt.poller.poll_all()
    # This time the poll reached it.
    assert "partitioned" not in rt.poller.last_errors.get("near", "")


def test_a_partition_expires_on_its_own() -> None:
    partition = PeerPartition()
    partition.set(["b"], until=100.0)
    assert partition.active(now=99.0) == frozenset({"b"})
    assert partition.active(now=100.0) == frozenset()
    assert partition.view() == {"partition": [], "until": None}
