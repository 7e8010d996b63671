"""Fixtures for the emulated replica: engines built in-process and served replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from core.tokenizer import WordTokenizer
from sim.engine import Engine, EngineConfig, Vocabulary
from tests.support.processes import ProcessGroup, free_port_run
from tests.support.sim_serve import ServedReplicas, start_replicas


@pytest.fixture(scope="session")
def vocab() -> Vocabulary:
    return Vocabulary(WordTokenizer())


@pytest.fixture
def make_engine(vocab: Vocabulary) -> Callable[..., Engine]:
    """``make_engine(num_blocks=8, ...)``: an L4-profile engine with overridden knobs."""

    def build(**overrides: object) -> Engine:
        return Engine(replace(EngineConfig(), **overrides), vocab)  # type: ignore[arg-type]

    return build


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedReplicas]:
    """Two replicas, ``a`` and ``b``, in one child process shared by a test module.

    Tests that set a fault on it clear the fault before they end.
    """
    group = ProcessGroup(Path(tmp_path_factory.mktemp("sim-logs")))
    try:
        yield start_replicas(
            group, ["a", "b"], "--lora", "sql-expert", kv_port_base=free_port_run(2)
        )
    finally:
        group.stop_all()
