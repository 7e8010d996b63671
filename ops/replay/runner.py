"""Drive a workload against a sender in real time.

``ReplayRunner`` starts programs when the arrival process says (open loop: at their
offsets; closed loop: whenever a client is free), runs each program's steps as
their dependencies finish (a step waits for the replies it quotes; siblings go
concurrently), and folds every outcome into ``ReplayStats``.

It stops at the first of: the end of the workload, ``duration`` seconds,
``stop()`` (the command wires SIGINT/SIGTERM to it).  ``max_requests`` is a budget:
once spent, no step is sent and the run ends when what is in flight finishes.
On stop, in-flight requests are cancelled (the SDK closes their streams, so the
server sees the disconnect) and counted as cancelled.

A 401 before any request succeeded aborts the whole run with ``ApiKeyRejected``:
every other request would fail the same way, and the user needs to fix the key.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ops.replay.sender import ApiKeyRejected, Sender
from ops.replay.stats import ReplaySnapshot, ReplayStats
from sim.workloads import Arrivals, ClosedLoop, OpenLoop, Program


@dataclass(frozen=True)
class ReplayLimits:
    """When to stop early; ``None`` means no limit of that kind."""

    duration: float | None = None
    max_requests: int | None = None


class ReplayRunner:
    """Replays programs through a ``Sender``; one instance per run."""

    def __init__(
        self,
        programs: Iterable[Program],
        arrivals: Arrivals,
        sender: Sender,
        *,
        limits: ReplayLimits | None = None,
        on_tick: Callable[[ReplaySnapshot], None] | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.programs = programs
        self.arrivals = arrivals
        self.sender = sender
        self.limits = limits or ReplayLimits()
        self.on_tick = on_tick
        self.tick_s = tick_s
        self.stats = ReplayStats()
        self._stop = asyncio.Event()
        self._abort: ApiKeyRejected | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Ask the run to end now; safe to call from a signal handler."""
        self._stop.set()

    async def run(self) -> ReplaySnapshot:
        """Run until the workload, the duration or the budget ends, or ``stop()``."""
        self.stats.start()
        driver = asyncio.create_task(self._drive())
        stopper = asyncio.create_task(self._stop.wait())
        ticker = asyncio.create_task(self._tick()) if self.on_tick else None
        try:
            await asyncio.wait(
                {driver, stopper}, timeout=self.limits.duration, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            await self._cancel(driver, stopper, ticker, *self._tasks)
        if self._abort is not None:
            raise self._abort
        if driver.done() and not driver.cancelled():
            driver.result()  # re-raises a bug in the driver or a program, never hides it
        return self.stats.snapshot()

    async def _cancel(self, *tasks: asyncio.Task[object] | None) -> None:
        live = [task for task in tasks if task is not None and not task.done()]
        for task in live:
            task.cancel()
        await asyncio.gather(*live, return_exceptions=True)

    async def _tick(self) -> None:
        assert self.on_tick is not None
        while True:
            await asyncio.sleep(self.tick_s)
            self.on_tick(self.stats.snapshot())

    # -- arrivals ---------------------------------------------------------------

    async def _drive(self) -> None:
        if isinstance(self.arrivals, ClosedLoop):
            await self._drive_closed_loop(self.arrivals)
        else:
            await self._drive_open_loop(self.arrivals)
        await self._join()

    async def _drive_open_loop(self, arrivals: OpenLoop) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        for program in arrivals.schedule(self.programs):
            if self._budget_spent():
                return
            # Sleeping even for 0 lets the programs already started take their
            # budget, so an endless workload cannot spin here.
            await asyncio.sleep(max(0.0, started + program.start - loop.time()))
            self._spawn(self._run_program(program))

    async def _drive_closed_loop(self, arrivals: ClosedLoop) -> None:
        dispatcher = arrivals.dispatcher(self.programs)

        async def client(number: int, program: Program | None) -> None:
            await asyncio.sleep(arrivals.start_delay(number))
            while program is not None and not self._budget_spent():
                await self._run_program(program)
                program = dispatcher.finish(number)

        for number, program in dispatcher.start():
            self._spawn(client(number, program))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _join(self) -> None:
        # Tasks may start more tasks while we wait (closed-loop clients do not, but
        # keep it general), so wait until the set is empty.
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    # -- programs ---------------------------------------------------------------

    async def _run_program(self, program: Program) -> None:
        replies: dict[int, str] = {}
        steps: list[asyncio.Task[bool]] = []
        for index, step in enumerate(program.steps):
            waits_on = [steps[dep] for dep in step.after]
            steps.append(asyncio.create_task(self._run_step(program, index, waits_on, replies)))
        await asyncio.gather(*steps)

    async def _run_step(
        self,
        program: Program,
        index: int,
        waits_on: list[asyncio.Task[bool]],
        replies: dict[int, str],
    ) -> bool:
        """Send step ``index`` once its dependencies succeeded; True when it did too.

        A step whose dependency failed is not sent: its prompt would quote a reply
        that does not exist.
        """
        if not all(await asyncio.gather(*waits_on)) or self._budget_spent():
            return False
        request = program.steps[index].render(replies, program.session_key)
        self.stats.request_started()
        try:
            outcome = await self.sender.send(request)
        except BaseException:
            # Cancelled on stop (or a bug): release the in-flight count either way.
            self.stats.request_cancelled()
            raise
        self.stats.request_finished(outcome)
        if outcome.status == 401 and self.stats.ok == 0:
            self._abort = ApiKeyRejected("the endpoint", outcome.error)
            self.stop()
        if outcome.ok:
            replies[index] = outcome.reply
        return outcome.ok

    def _budget_spent(self) -> bool:
        limit = self.limits.max_requests
        return limit is not None and self.stats.sent >= limit


@contextlib.contextmanager
def stop_on_signals(runner: ReplayRunner, signals: Iterable[int]) -> Iterator[None]:
    """Route ``signals`` to ``runner.stop`` while the block runs.

    Only the main thread can own signal handlers; elsewhere (a replay started from
    a worker thread) the caller stops the runner itself.
    """
    loop = asyncio.get_running_loop()
    installed = list(signals) if threading.current_thread() is threading.main_thread() else []
    for number in installed:
        loop.add_signal_handler(number, runner.stop)
    try:
        yield
    finally:
        for number in installed:
            loop.remove_signal_handler(number)
