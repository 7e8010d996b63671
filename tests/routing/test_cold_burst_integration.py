"""A cold connection pool under a burst: 128 simultaneous non-streaming requests on a
balancer that has not yet opened a connection to its replicas all succeed.

Real processes: a daphne balancer and two emulated replicas on 127.0.0.1, and the
burst from one ``httpx.AsyncClient`` with room for every request at once, so all
128 reach the balancer together and each needs an upstream connection the pool
does not have yet.  (``test_unwarmed_burst_integration`` does the same with the
pool's warming turned off.)
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
# Busy-loop processes that compete with the balancer for the CPU during the burst,
# as on the busy machine where a cold pool's connects once timed out.
HOGS = 4


@pytest.fixture(scope="module")
def region(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Region]:
    yield burst_region(topology, child_env, module_processes, "cb")


def test_a_burst_on_a_cold_pool_gets_no_errors(region: Region) -> None:
    with cpu_hog(HOGS):
        outcomes = asyncio.run(burst(region, BURST))
    assert outcomes == Counter({"ok": BURST}), outcomes
