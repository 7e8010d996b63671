"""Which programs each region's clients run, and how they arrive.

* ``--clients us-east=40,...``: closed loop (SkyLB §5.1), one workload stream per
  region; region *i* is seeded ``seed + 7919·i`` so regions do not replay the
  same conversations (region 0 uses ``seed`` itself, as ``manage.py replay``).
  A trace file (``sharegpt:``, ``mooncake:``, ``azure:``) is dealt instead over
  the *n* regions that send, by session as below, so each recorded conversation
  is one user's, in one region.  Replaying the whole file in every region would
  have three users send identical conversations, and the oracle bounds would
  count that copy as reuse across regions.
* ``--rate us-east=2,...``: open-loop Poisson arrivals per region (programs chosen
  as for ``--clients``).
* neither: the workload must be a timed trace.  A ServeGen trace is replayed in
  every region, time-shifted by ``i · 24 h / regions`` so each region's diurnal
  peak falls at a different hour; any other trace is dealt round-robin across
  regions by session (the *k*-th session to start goes to region *k mod n*, and
  its later requests follow it: a Mooncake conversation's turns stay together).

A ``+`` between workload specs mixes them program by program, e.g. SkyLB's
"mixed ToT" (Figure 8d) is ``tot:branching=2+tot:branching=4``; session keys are
prefixed by the part so two parts' trees never share a consistent-hash key.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from sim.des.clients import RegionClients
from sim.des.config import SimConfig, SimConfigError
from sim.workloads import ClosedLoop, OpenLoop, Program, Workload, parse_workload
from sim.workloads.registry import reads_trace_file
from sim.workloads.servegen import ServeGenTrace

DAY_S = 86_400.0
REGION_SEED_STRIDE = 7919


class MixedWorkload:
    """Programs taken in turn from several workloads (untimed ones only)."""

    name = "mixed"
    timed = False

    def __init__(self, parts: list[Workload]) -> None:
        if any(part.timed for part in parts):
            raise SimConfigError("only untimed (synthetic) workloads can be mixed with '+'")
        self.parts = parts

    def programs(self) -> Iterator[Program]:
        streams = [part.programs() for part in self.parts]
        for k, (j, stream) in enumerate(itertools.cycle(enumerate(streams))):
            program = next(stream)
            key = f"p{j}:{program.session_key}" if program.session_key else ""
            yield dataclasses.replace(program, program_id=k, session_key=key)


def _dealt(programs: Iterator[Program], index: int, count: int) -> Iterator[Program]:
    """Region ``index`` of ``count``'s programs: sessions dealt in turn as they start
    (a program without a session key is one of its own), later programs following
    their session's first, so one user's conversation stays in one region."""
    regions: dict[str, int] = {}
    started = 0
    for program in programs:
        key = program.session_key
        region = regions.get(key) if key else None
        if region is None:
            region, started = started % count, started + 1
            if key:
                regions[key] = region
        if region == index:
            yield program


class DealtWorkload:
    """Region ``index`` of ``count``'s share of a trace file: every ``count``-th program."""

    def __init__(self, workload: Workload, index: int, count: int) -> None:
        self.workload = workload
        self.index = index
        self.count = count
        self.name = workload.name
        self.timed = workload.timed

    def programs(self) -> Iterator[Program]:
        return _dealt(self.workload.programs(), self.index, self.count)


def region_workload(
    spec: str, seed: int, *, deal: tuple[int, int] = (0, 1), file_seed: int | None = None
) -> Workload:
    """The workload ``spec`` for one region: synthetic parts seeded with ``seed``; trace
    files (seeded with ``file_seed``, the same in every region, so the shares add up to
    the file) dealt as ``deal`` = (this region's index, regions)."""
    parts = [_region_part(part, seed, deal, file_seed) for part in spec.split("+")]
    return parts[0] if len(parts) == 1 else MixedWorkload(parts)


def _region_part(spec: str, seed: int, deal: tuple[int, int], file_seed: int | None) -> Workload:
    if not reads_trace_file(spec):
        return parse_workload(spec, seed=seed)
    workload = parse_workload(spec, seed=seed if file_seed is None else file_seed)
    index, count = deal
    return workload if count == 1 else DealtWorkload(workload, index, count)


@dataclass(frozen=True)
class RegionArrivals:
    """A region's programs and their arrival process (None: no clients there)."""

    arrivals: ClosedLoop | OpenLoop | None
    programs: Iterator[Program] | None

    def start(self, clients: RegionClients) -> None:
        if self.programs is None or self.arrivals is None:
            return
        if isinstance(self.arrivals, ClosedLoop):
            clients.start_closed(self.arrivals, self.programs)
        else:
            clients.start_open(self.arrivals, self.programs)


def region_arrivals(cfg: SimConfig, index: int) -> RegionArrivals:
    region = cfg.regions[index]
    seed = cfg.seed + REGION_SEED_STRIDE * index
    if cfg.clients or cfg.rate:
        clients, rate = cfg.clients.get(region, 0), cfg.rate.get(region, 0.0)
        if not clients and rate <= 0:
            return RegionArrivals(None, None)
        senders = [r for r in cfg.regions if cfg.clients.get(r, 0) or cfg.rate.get(r, 0.0) > 0]
        deal = (senders.index(region), len(senders))
        workload = region_workload(cfg.workload, seed, deal=deal, file_seed=cfg.seed)
        if clients:
            return RegionArrivals(ClosedLoop(clients, cfg.ramp_s), workload.programs())
        return RegionArrivals(OpenLoop(rate=rate, seed=seed), workload.programs())
    workload = region_workload(cfg.workload, cfg.seed)
    if not workload.timed:
        raise SimConfigError(
            f"{cfg.workload} has no timestamps: give --clients (closed loop) or --rate"
        )
    arrivals = OpenLoop(rate=None, speed=cfg.speed)
    if isinstance(workload, ServeGenTrace):
        shifted = workload.shifted(index * DAY_S / len(cfg.regions))
        return RegionArrivals(arrivals, shifted.programs())
    return RegionArrivals(arrivals, _dealt(workload.programs(), index, len(cfg.regions)))
