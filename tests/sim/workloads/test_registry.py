"""Parsing ``--workload`` values."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.workloads import WorkloadSpecError, parse_workload
from sim.workloads.azure import AzureTrace
from sim.workloads.mooncake import MooncakeTrace
from sim.workloads.sharegpt import ShareGptConversations
from sim.workloads.synthetic import TreeOfThought


def test_synthetic_options_and_seed() -> None:
    workload = parse_workload("tot:branching=4,depth=3,ignore_eos=true", seed=5)
    assert isinstance(workload, TreeOfThought)
    assert (workload.config.branching, workload.config.depth) == (4, 3)
    assert workload.config.ignore_eos is True
    assert workload.config.seed == 5


def test_trace_names_take_a_path(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text("")
    assert isinstance(parse_workload(f"mooncake:{path}"), MooncakeTrace)
    assert isinstance(parse_workload(f"azure:{path}"), AzureTrace)
    assert isinstance(parse_workload(f"sharegpt:{path}"), ShareGptConversations)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("chatter", "unknown workload 'chatter'; choose one of: conversations"),
        ("mooncake", "use mooncake:PATH"),
        ("azure:/no/such/file.csv", "azure trace file not found: /no/such/file.csv"),
        ("tot:width=3", "bad option 'width=3'"),
        ("tot:branching=two", "branching='two' is not a valid int"),
        ("tot:branching=0", "branching"),
        ("conversations:seed=3", "bad option 'seed=3'"),
    ],
)
def test_bad_specs_are_explained(spec: str, message: str) -> None:
    with pytest.raises(WorkloadSpecError, match=message):
        parse_workload(spec)
