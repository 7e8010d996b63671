"""When programs start: open loop (fixed arrival times) or closed loop (N clients).

* Open loop: arrivals do not wait for the system.  Either a Poisson process at
  ``rate`` programs per second (exponential gaps, seeded), or the trace's own
  timestamps divided by ``speed`` (``speed=2`` replays an hour in thirty minutes).
  A slow server then builds a queue, which is what a latency-versus-load curve
  needs to show.
* Closed loop: ``clients`` clients, each running one program at a time and taking
  the next program as soon as its current one finishes, as SkyLB's evaluation
  drives its workloads.  Load adapts to the server; arrival offsets are ignored.
  They all start at once unless ``ramp_s`` spreads their starts evenly over that
  many seconds, as a load test ramps up: every client's first request landing in
  the same instant is a burst no real service sees, and it can decide a short
  run's TTFT percentiles (docs/results.md, *Admission in time*).

Both are plain logic with no clock, so the discrete-event simulator can drive them
with virtual time and the replayer with real time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sim.workloads.program import Program, Workload
from sim.workloads.text import seeded

# Programs per second when an untimed workload is given neither a rate nor clients.
DEFAULT_RATE = 1.0


def poisson_offsets(rate: float, seed: int = 0) -> Iterator[float]:
    """Start offsets of a Poisson process at ``rate`` per second; the first is 0 so a
    replay starts sending at once."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = seeded("poisson", seed, rate)
    at = 0.0
    while True:
        yield at
        at += rng.expovariate(rate)


@dataclass(frozen=True)
class OpenLoop:
    """Fixed arrival times: Poisson at ``rate`` or, with ``rate=None``, the programs'
    own ``start`` offsets scaled by ``1/speed``."""

    rate: float | None = None
    speed: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.speed <= 0:
            raise ValueError(f"speed must be positive, got {self.speed}")

    def describe(self) -> str:
        if self.rate is not None:
            return f"open loop, Poisson at {self.rate:g} programs/s"
        return f"open loop, trace timestamps at {self.speed:g}x speed"

    def schedule(self, programs: Iterable[Program]) -> Iterator[Program]:
        """The programs with ``start`` set to their arrival offset, in arrival order
        (traces are in time order; a Poisson process is by construction)."""
        if self.rate is not None:
            for program, at in zip(programs, poisson_offsets(self.rate, self.seed), strict=False):
                yield dataclasses.replace(program, start=at)
        else:
            for program in programs:
                yield dataclasses.replace(program, start=program.start / self.speed)


@dataclass(frozen=True)
class ClosedLoop:
    """``clients`` clients, each running one program at a time."""

    clients: int
    ramp_s: float = 0.0

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError(f"clients must be at least 1, got {self.clients}")
        if not self.ramp_s >= 0.0:  # NaN too
            raise ValueError(f"ramp must be at least 0 s, got {self.ramp_s}")

    def describe(self) -> str:
        ramp = f", started over {self.ramp_s:g} s" if self.ramp_s else ""
        return f"closed loop, {self.clients} clients{ramp}"

    def start_delay(self, client: int) -> float:
        """Seconds after the run's start that ``client`` (0-based) sends its first request."""
        return self.ramp_s * client / self.clients

    def dispatcher(self, programs: Iterable[Program]) -> ClosedLoopDispatcher:
        return ClosedLoopDispatcher(programs, self.clients)


class ClosedLoopDispatcher:
    """Hands programs to clients: one each at the start, the next one when a client
    reports that its program finished.  Clients share one program sequence, so the
    workload's order is kept whatever the completion order."""

    def __init__(self, programs: Iterable[Program], clients: int) -> None:
        self._programs = iter(programs)
        self.clients = clients
        self.busy: set[int] = set()

    def start(self) -> list[tuple[int, Program]]:
        """``(client, program)`` for every client that gets a first program."""
        started = []
        for client, program in zip(range(self.clients), self._programs, strict=False):
            self.busy.add(client)
            started.append((client, dataclasses.replace(program, start=0.0)))
        return started

    def finish(self, client: int) -> Program | None:
        """The next program for ``client``, whose program just finished; ``None`` when
        the workload is exhausted (the client then stops)."""
        self.busy.discard(client)
        program = next(self._programs, None)
        if program is None:
            return None
        self.busy.add(client)
        return dataclasses.replace(program, start=0.0)


Arrivals = OpenLoop | ClosedLoop


def choose_arrivals(
    workload: Workload,
    *,
    rate: float | None = None,
    clients: int | None = None,
    speed: float = 1.0,
    seed: int = 0,
    ramp_s: float = 0.0,
) -> Arrivals:
    """The arrival process the command line asks for, with sensible defaults: a
    timed trace follows its own timestamps, anything else Poisson at 1/s."""
    if rate is not None and clients is not None:
        raise ValueError("give either a rate (open loop) or a number of clients (closed loop)")
    if ramp_s and clients is None:
        raise ValueError("a ramp spreads closed-loop clients' starts: give a number of clients")
    if clients is not None:
        return ClosedLoop(clients, ramp_s)
    if rate is None and not workload.timed:
        rate = DEFAULT_RATE
    return OpenLoop(rate=rate, speed=speed, seed=seed)
