"""128 simultaneous first requests on a pool that never opened a connection all succeed.

``MERIDIAN_UPSTREAM_WARM_CONNECTIONS=0`` turns the pool's warming off, so every
request of the burst finds no idle connection and asks for one of its own.  The
pool opens at most ``MAX_CONNECTING_PER_ORIGIN`` at a time per replica; the rest
wait their turn (or take a connection another request has given back) instead
of running their connect timeout down behind the others.  Real processes: a
daphne balancer and two emulated replicas on 127.0.0.1, with busy loops
competing for the CPU as on the busy machine where 26 of 128 once failed.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.support.balancers import TopologyFactory
from tests.support.bursts import Region, burst, burst_region
from tests.support.load import cpu_hog
from tests.support.processes import ProcessGroup

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

BURST = 128
HOGS = 4


@pytest.fixture(scope="module")
def region(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Region]:
    yield burst_region(
        topology, child_env, module_processes, "ub", MERIDIAN_UPSTREAM_WARM_CONNECTIONS="0"
    )


def test_a_burst_on_a_pool_that_never_warmed_gets_no_errors(region: Region) -> None:
    with cpu_hog(HOGS):
        outcomes = asyncio.run(burst(region, BURST))
    assert outcomes == Counter({"ok": BURST}), outcomes
