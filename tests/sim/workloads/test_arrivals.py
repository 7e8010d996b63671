"""Open-loop arrivals ignore the server; closed-loop clients wait for it."""

from __future__ import annotations

import heapq
import itertools
import statistics
from pathlib import Path

import pytest

from sim.workloads import ClosedLoop, OpenLoop, choose_arrivals, parse_workload
from sim.workloads.azure import AzureTrace
from tests.support.workloads import first


def test_poisson_arrivals_are_seeded_and_have_the_asked_rate() -> None:
    programs = first(parse_workload("system-prompts"), 2000)
    starts = [p.start for p in OpenLoop(rate=4.0, seed=3).schedule(programs)]
    assert starts == [p.start for p in OpenLoop(rate=4.0, seed=3).schedule(programs)]
    assert starts[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= 0 for gap in gaps)
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.1)


def test_trace_timestamps_are_scaled_by_speed(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0000000,5,5\n2023-11-16 18:00:10.0000000,5,5\n"
    )
    trace = AzureTrace(path)
    arrivals = choose_arrivals(trace, speed=4.0)
    assert [p.start for p in arrivals.schedule(trace.programs())] == [0.0, 2.5]


def simulate_closed_loop(clients: int, durations: list[float]) -> tuple[list[float], int]:
    """Virtual-time run: program k takes durations[k]; returns start times and the most
    programs ever running at once."""
    programs = first(parse_workload("system-prompts"), len(durations))
    dispatcher = ClosedLoop(clients).dispatcher(programs)
    running: list[tuple[float, int, int]] = []  # (finish time, client, program id)
    starts: dict[int, float] = {}
    peak = 0
    for client, program in dispatcher.start():
        starts[program.program_id] = 0.0
        heapq.heappush(running, (durations[program.program_id], client, program.program_id))
    while running:
        peak = max(peak, len(running))
        now, client, _ = heapq.heappop(running)
        program = dispatcher.finish(client)
        if program is not None:
            starts[program.program_id] = now
            heapq.heappush(
                running, (now + durations[program.program_id], client, program.program_id)
            )
    return [starts[k] for k in sorted(starts)], peak


def test_closed_loop_clients_run_one_program_at_a_time() -> None:
    starts, peak = simulate_closed_loop(2, [5.0, 1.0, 1.0, 1.0, 1.0])
    assert peak == 2
    # Client B finishes program 1 at t=1, then runs 2 (t=1..2), 3 (t=2..3), 4 (t=3..4)
    # while client A is still busy with the long program 0.
    assert starts == [0.0, 0.0, 1.0, 2.0, 3.0]


def test_open_loop_does_not_wait_for_slow_programs() -> None:
    programs = first(parse_workload("system-prompts"), 50)
    starts = [p.start for p in OpenLoop(rate=10.0).schedule(programs)]
    # However long each program takes, arrival k is fixed in advance: far more than
    # two programs start within the first 5 s that two closed-loop clients would fill.
    closed_starts, _ = simulate_closed_loop(2, [5.0] * 50)
    assert sum(1 for at in starts if at < 5.0) > 2
    assert sum(1 for at in closed_starts if at < 5.0) == 2


def test_choose_arrivals_defaults() -> None:
    synthetic = parse_workload("conversations")
    assert choose_arrivals(synthetic) == OpenLoop(rate=1.0)
    assert choose_arrivals(synthetic, clients=3) == ClosedLoop(3)
    assert choose_arrivals(synthetic, clients=3, ramp_s=6.0) == ClosedLoop(3, ramp_s=6.0)
    with pytest.raises(ValueError, match="ramp"):
        choose_arrivals(synthetic, rate=2.0, ramp_s=6.0)
    with pytest.raises(ValueError, match="either"):
        choose_arrivals(synthetic, rate=2.0, clients=3)
    with pytest.raises(ValueError, match="clients"):
        ClosedLoop(0)


def test_a_ramp_spreads_closed_loop_clients_first_starts_evenly() -> None:
    ramped = ClosedLoop(4, ramp_s=2.0)
    assert [ramped.start_delay(c) for c in range(4)] == [0.0, 0.5, 1.0, 1.5]
    assert [ClosedLoop(3).start_delay(c) for c in range(3)] == [0.0, 0.0, 0.0]
    assert ramped.describe() == "closed loop, 4 clients, started over 2 s"
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="ramp"):
            ClosedLoop(2, ramp_s=bad)
