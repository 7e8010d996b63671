"""Which programs each region runs: mixing, per-region seeds, traces dealt or shifted."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sim.des.config import SimConfig, SimConfigError
from sim.des.workloads import MixedWorkload, region_arrivals, region_workload
from sim.workloads import ClosedLoop, OpenLoop
from sim.workloads.servegen import ServeGenTrace


def test_mixing_takes_programs_in_turn_and_keeps_session_keys_apart() -> None:
    mixed = region_workload("tot:branching=2,depth=2+tot:branching=4,depth=2", seed=1)
    assert isinstance(mixed, MixedWorkload)
    programs = list(itertools.islice(mixed.programs(), 4))
    assert [len(p.steps) for p in programs] == [3, 5, 3, 5]
    assert [p.program_id for p in programs] == [0, 1, 2, 3]
    assert programs[0].session_key == "p0:tree-0"
    assert programs[1].session_key == "p1:tree-0"


def test_timed_traces_cannot_be_mixed(tmp_path: Path) -> None:
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(SimConfigError, match="untimed"):
        region_workload(f"conversations+mooncake:{trace}", seed=0)


def test_regions_get_their_own_seeded_streams(make_config: Callable[..., SimConfig]) -> None:
    config = make_config(clients={"us-east": 2, "eu-west": 2})
    east, west = region_arrivals(config, 0), region_arrivals(config, 1)
    assert isinstance(east.arrivals, ClosedLoop) and east.programs and west.programs
    assert next(east.programs).steps != next(west.programs).steps


def test_a_region_without_clients_sends_nothing(make_config: Callable[..., SimConfig]) -> None:
    config = make_config(clients={"us-east": 2})
    assert region_arrivals(config, 1).programs is None


def test_an_untimed_workload_needs_clients_or_a_rate(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config(clients={})
    with pytest.raises(SimConfigError, match="--clients"):
        region_arrivals(config, 0)


def test_a_trace_is_dealt_across_regions(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    trace = tmp_path / "m.jsonl"
    rows = (
        {"timestamp": i * 100, "input_length": 8, "output_length": 2, "hash_ids": [i]}
        for i in range(6)
    )
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = make_config(workload=f"mooncake:{trace}", clients={})
    east, west = region_arrivals(config, 0), region_arrivals(config, 1)
    assert isinstance(east.arrivals, OpenLoop) and east.programs and west.programs
    assert [p.start for p in east.programs] == [0.0, 0.2, 0.4]
    assert [p.start for p in west.programs] == [0.1, 0.3, 0.5]


def test_a_traced_conversation_stays_in_the_region_of_its_first_turn(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    trace = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2]},
        {"timestamp": 100, "input_length": 600, "output_length": 2, "hash_ids": [5, 6]},
        {"timestamp": 200, "input_length": 1200, "output_length": 2, "hash_ids": [1, 2, 3]},
        {"timestamp": 300, "input_length": 600, "output_length": 2, "hash_ids": [7, 8]},
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = make_config(workload=f"mooncake:{trace}", clients={})
    east, west = region_arrivals(config, 0), region_arrivals(config, 1)
    assert east.programs is not None and west.programs is not None
    assert [p.start for p in east.programs] == [0.0, 0.2, 0.3]  # the second turn follows
    assert [p.start for p in west.programs] == [0.1]


def _sharegpt_file(tmp_path: Path, count: int) -> Path:
    trace = tmp_path / "s.jsonl"
    rows = (
        {
            "id": f"c{i}",
            "conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}],
        }
        for i in range(count)
    )
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return trace


def test_a_conversation_file_in_closed_loop_is_dealt_not_copied_to_every_region(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    trace = _sharegpt_file(tmp_path, 5)
    config = make_config(workload=f"sharegpt:{trace}", clients={"us-east": 2, "eu-west": 2})
    east, west = region_arrivals(config, 0), region_arrivals(config, 1)
    assert east.programs is not None and west.programs is not None
    assert [p.session_key for p in east.programs] == ["sharegpt-c0", "sharegpt-c2", "sharegpt-c4"]
    assert [p.session_key for p in west.programs] == ["sharegpt-c1", "sharegpt-c3"]


def test_only_regions_with_clients_share_a_conversation_file(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    trace = _sharegpt_file(tmp_path, 3)
    config = make_config(
        workload=f"sharegpt:{trace}", clients={}, rate={"us-east": 0.0, "eu-west": 1.0}
    )
    west = region_arrivals(config, 1)
    assert isinstance(west.arrivals, OpenLoop) and west.programs is not None
    assert len(list(west.programs)) == 3


def test_synthetic_parts_of_a_mix_stay_per_region_while_its_file_is_dealt(
    make_config: Callable[..., SimConfig], tmp_path: Path
) -> None:
    trace = _sharegpt_file(tmp_path, 4)
    config = make_config(
        workload=f"sharegpt:{trace}+tot:branching=2,depth=2", clients={"us-east": 1, "eu-west": 1}
    )
    east, west = region_arrivals(config, 0), region_arrivals(config, 1)
    assert east.programs is not None and west.programs is not None
    east_first, east_tree = itertools.islice(east.programs, 2)
    west_first, west_tree = itertools.islice(west.programs, 2)
    assert (east_first.session_key, west_first.session_key) == ("p0:sharegpt-c0", "p0:sharegpt-c1")
    assert east_tree.steps != west_tree.steps


def test_servegen_is_shifted_a_fraction_of_a_day_per_region(
    make_config: Callable[..., SimConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "chunk-1-trace.csv").write_text("0,1.0,1.0,Gamma,1.0,1.0\n")
    shifts: list[float] = []
    original = ServeGenTrace.shifted

    def spy(self: ServeGenTrace, offset_s: float) -> ServeGenTrace:
        shifts.append(offset_s)
        return original(self, offset_s)

    monkeypatch.setattr(ServeGenTrace, "shifted", spy)
    config = make_config(workload=f"servegen:{tmp_path}", clients={})
    for index in range(2):
        region_arrivals(config, index)
    assert shifts == [0.0, 43_200.0]
