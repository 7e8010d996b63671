"""Fixtures for the balancer's tests (helpers live in ``tests/support``).

In-process async tests run on asyncio (the balancer's loop under uvicorn or
daphne) with a real ``BalancerRuntime`` built by ``build_runtime``
(``tests.support.inprocess``) against loopback upstreams
(``tests.support.upstreams``).

Integration tests start real processes (``tests.support.balancers``), sharing
them across a module because each start costs a Django import; the topology rows
those processes read are committed by a module-scoped ``TopologyFactory`` and
deleted when the module ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from ops.embedded_redis import EmbeddedRedis
from routing.runtime import BalancerRuntime
from tests.support.balancers import TopologyFactory
from tests.support.django_env import child_process_env
from tests.support.inprocess import runtime_for
from tests.support.processes import ProcessGroup
from tests.support.upstreams import Upstreams


@pytest.fixture
def anyio_backend() -> str:
    # The balancer runs on asyncio; test on it only.
    return "asyncio"


@pytest.fixture
async def build_runtime() -> AsyncIterator[Callable[..., Awaitable[BalancerRuntime]]]:
    """``await build_runtime(upstreams, replicas=..., peers=..., model=..., **config)``;
    the runtimes and the upstreams' servers are closed when the test ends."""
    made: list[tuple[BalancerRuntime, Upstreams]] = []

    async def make(upstreams: Upstreams, **options: Any) -> BalancerRuntime:
        rt = await runtime_for(upstreams, **options)
        made.append((rt, upstreams))
        return rt

    yield make
    for rt, upstreams in made:
        await rt.close()
        await upstreams.close()


@pytest.fixture(scope="module")
def topology(django_db_setup: None, django_db_blocker: Any) -> Iterator[TopologyFactory]:
    factory = TopologyFactory()
    with django_db_blocker.unblock():
        yield factory
        factory.delete_all()


@pytest.fixture(scope="module")
def child_env(topology: TopologyFactory, redis_server: EmbeddedRedis) -> dict[str, str]:
    """Environment for balancer processes: this session's test database and Redis.

    Module-scoped twin of the suite's ``django_subprocess_env`` (which is
    function-scoped because it rides on the ``db`` fixture)."""
    return child_process_env(redis_server.url)


@pytest.fixture(scope="module")
def module_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path_factory.mktemp("routing-processes"))
    yield group
    group.stop_all()
