"""One dispatch core, two drivers: the balancer and the simulator decide alike.

The same scripted scenario runs through the asyncio balancer (a real
``BalancerRuntime`` on this loop, its production clients talking to loopback
upstreams) and through the simulator's ``SimBalancer`` (virtual time, a
scripted network).  Each records what its ``DispatchCore`` decided, and the two
sequences must be the same: which request, which decision, which target or
refusal (not when: one runs on the wall clock, the other in virtual time).

The scenario: replica ``a`` under SP-P (push budget 1), a peer ``near``, a
queue of two that gives up after 0.3 s.

1. A probe shows ``a`` with requests waiting: it is unavailable.
2. ``r1`` arrives and is forwarded to ``near``, which refuses it (503); ``a``
   is healthy and untried, so ``r1`` waits.
3. ``near`` reports it has no healthy replica left.
4. ``r2`` arrives behind ``r1`` and waits (FCFS); ``r3`` finds the queue full.
5. A probe shows ``a`` free: ``r1`` goes to it, on its second attempt; ``r2``
   stays (``a`` took its one push, ``near`` has no room).
6. ``r2`` reaches its deadline: 503.
7. ``a`` finishes ``r1``; ``r4`` arrives to an empty queue and goes to ``a``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from core.availability import PushingConfig, PushingMode
from core.dispatch import DispatchCore, Drained, Refuse, Send, Wait
from core.errors import ApiError
from core.topology import ModelSpec, PeerSpec, ReplicaSpec
from core.types import RequestDescriptor
from routing.runtime import BalancerRuntime
from sim.des.balancer import SimBalancer
from sim.des.calls import CallResult, Journey, SimCall
from sim.des.config import TimingConfig
from tests.support.inprocess import peer_report, proxy_call
from tests.support.sim_network import RefusingPeer, ScriptedNetwork, ScriptedReplica
from tests.support.upstreams import MODEL, Upstreams

pytestmark = pytest.mark.anyio

SPEC = ModelSpec(
    MODEL, pushing=PushingConfig(PushingMode.SP_P), queue_max_len=2, queue_max_wait_s=0.3
)
NEAR = PeerSpec("near", "http://near", "eu", 80.0)

Record = tuple[Any, ...]

EXPECTED = [
    ("send", "r1", "near", False),
    ("wait", "r1"),
    ("wait", "r2"),
    ("refuse", "r3", "queue_full"),
    ("send", "r1", "a", True),
    ("refuse", "r2", "queue_timeout"),
    ("send", "r4", "a", False),
]


def _record(decision: Any) -> Record:
    rid = decision.ticket.request.request_id
    if isinstance(decision, Send):
        return ("send", rid, decision.placement.label, decision.retry)
    if isinstance(decision, Wait):
        return ("wait", rid)
    assert isinstance(decision, Refuse)
    return ("refuse", rid, decision.error.code)


def recording(core: DispatchCore[Any]) -> list[Record]:
    """Every decision ``core`` returns from now on, in order (its driver is unchanged)."""
    log: list[Record] = []

    def decided(method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if isinstance(result, Drained):
                log.extend(_record(send) for send in result.sends)
            elif isinstance(result, list):
                log.extend(_record(refusal) for refusal in result)
            else:
                log.append(_record(result))
            return result

        return wrapper

    for name in ("arrive", "failed", "drain", "expire"):
        setattr(core, name, decided(getattr(core, name)))
    return log


async def scenario(driver: Any) -> None:
    await driver.probe(waiting=3)
    await driver.arrive("r1")
    await driver.queued(1)
    await driver.peer_reports_no_healthy_replica()
    await driver.arrive("r2")
    await driver.queued(2)
    await driver.arrive("r3")
    assert await driver.answer("r3") == 429
    await driver.probe(waiting=0)
    await driver.reached_replica("r1")
    assert await driver.answer("r2") == 503
    driver.complete("r1")
    assert await driver.answer("r1") == 200
    await driver.arrive("r4")
    await driver.reached_replica("r4")
    driver.complete("r4")
    assert await driver.answer("r4") == 200


# -- the asyncio balancer -----------------------------------------------------------------


async def _until(check: Callable[[], bool], what: str) -> None:
    """A readiness wait on the real loop (bounded; not a timing claim)."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"still not {what}")


class AsyncioDriver:
    def __init__(self, rt: BalancerRuntime, upstreams: Upstreams) -> None:
        self.rt, self.upstreams = rt, upstreams
        self.decisions = recording(rt.core)
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    async def probe(self, *, waiting: int) -> None:
        self.upstreams.running["a"], self.upstreams.waiting["a"] = 0, waiting
        target = self.rt.router.target("a")
        assert target is not None
        await self.rt.prober.probe(target)

    async def arrive(self, rid: str) -> None:
        self.tasks[rid] = asyncio.create_task(self.rt.dispatcher.dispatch(proxy_call(rid=rid)))
        await asyncio.sleep(0)

    async def queued(self, length: int) -> None:
        await _until(lambda: self.rt.queues.total() == length, f"{length} queued")

    async def peer_reports_no_healthy_replica(self) -> None:
        self.rt.remote.record_report("near", peer_report("near", available=0, healthy=0))

    async def reached_replica(self, rid: str) -> None:
        def reached() -> bool:
            return any(c.headers["X-Request-ID"] == rid for c in self.upstreams.calls)

        await _until(reached, f"{rid} at a")

    def complete(self, rid: str) -> None:
        self.upstreams.release(rid)

    async def answer(self, rid: str) -> int:
        try:
            response = await asyncio.wait_for(self.tasks[rid], 10)
        except ApiError as error:
            return error.status
        status: int = response.status_code
        return status


# -- the simulator --------------------------------------------------------------------------

STEP_S = 0.05  # virtual time per scripted step: every hop and probe is done by then


class SimDriver:
    def __init__(self) -> None:
        self.replica = ScriptedReplica("a", "us")
        self.peer = RefusingPeer("eu")
        self.net = ScriptedNetwork([self.replica], {"near": self.peer})
        self.loop = self.net.loop
        self.lb = SimBalancer("lb-us", "us", self.net, TimingConfig())
        replicas = [ReplicaSpec("a", "sim://a", MODEL, "us", "us-1", "reserved")]
        self.lb.adopt(replicas, [NEAR], {MODEL: SPEC})
        self.lb.remote.record_report("near", peer_report("near"))
        self.decisions = recording(self.lb.core)
        self.results: dict[str, CallResult] = {}

    def _step(self) -> None:
        self.loop.run(until=self.loop.now + STEP_S)

    async def probe(self, *, waiting: int) -> None:
        self.replica.running, self.replica.waiting = 0, waiting
        self.lb.probe_soon(["a"])
        self._step()

    async def arrive(self, rid: str) -> None:
        descriptor = RequestDescriptor(rid, MODEL, prompt_tokens=3)
        call = SimCall(
            descriptor,
            [1, 2, 3],
            1,
            False,
            Journey(),
            on_first=lambda: None,
            on_done=lambda result: self.results.__setitem__(rid, result),
        )
        self.lb.submit(call)
        self._step()

    async def queued(self, length: int) -> None:
        assert self.lb.queues.total() == length

    async def peer_reports_no_healthy_replica(self) -> None:
        self.lb.remote.record_report("near", peer_report("near", available=0, healthy=0))
        self._step()

    async def reached_replica(self, rid: str) -> None:
        assert rid in self.replica.held

    def complete(self, rid: str) -> None:
        self.replica.finish(rid)

    async def answer(self, rid: str) -> int:
        for _ in range(100):
            if rid in self.results:
                return self.results[rid].status
            self._step()
        raise AssertionError(f"{rid} never answered")


# -- both ---------------------------------------------------------------------------------


async def test_the_balancer_and_the_simulator_make_the_same_decisions(build_runtime: Any) -> None:
    upstreams = Upstreams(a="hold", near="503")
    rt = await build_runtime(upstreams, replicas=("a",), peers=(NEAR,), model=SPEC)
    balancer = AsyncioDriver(rt, upstreams)
    await scenario(balancer)
    simulator = SimDriver()
    await scenario(simulator)
    assert balancer.decisions == simulator.decisions
    assert balancer.decisions == EXPECTED  # the story the module docstring tells
    assert upstreams.hosts() == ["near", "a", "a"] and rt.inflight() == 0
    assert simulator.peer.received == ["r1"] and simulator.lb.router.ledger.total == 0
