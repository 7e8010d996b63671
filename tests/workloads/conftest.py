"""Fixtures for workload tests: the shared tokenizer and tiny trace files in tmp_path."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from routing.core.tokenizer import WordTokenizer
from sim.workloads import Program, Workload


@pytest.fixture
def tokenizer() -> WordTokenizer:
    return WordTokenizer()


@pytest.fixture
def trace_file(tmp_path: Path) -> Callable[[str, str], Path]:
    """Write ``text`` to ``tmp_path/name`` and return the path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


def first(workload: Workload, count: int) -> list[Program]:
    """The first ``count`` programs of a (possibly endless) workload."""
    return list(itertools.islice(workload.programs(), count))
