"""The drill waits until every process behind a balancer's address knows its API key.

Each process reports when it last read the topology and how many siblings it shares
state with; fresh connections reach the processes in whatever order the kernel picks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from ops.drills import cli

ISSUED = 100.0


def _state(process: str, peers: int, loaded_at: float) -> dict[str, Any]:
    return {
        "topology_loaded_at": loaded_at,
        "redis": {"shared_state": {"process": process, "peers": peers}},
    }


def _answers(monkeypatch: pytest.MonkeyPatch, states: list[dict[str, Any] | None]) -> list[int]:
    """Answer the drill's asks with ``states`` in order (the last one from then on);
    returns a one-item list counting the asks."""
    asked = [0]

    def answer(base_url: str) -> dict[str, Any] | None:
        asked[0] += 1
        return states[min(asked[0], len(states)) - 1]

    monkeypatch.setattr(cli, "_internal_state", answer)
    monkeypatch.setattr(cli.time, "sleep", lambda s: None)
    return asked


@pytest.fixture
def deadline() -> Iterator[float]:
    yield time.monotonic() + 2.0


def test_a_process_that_has_not_met_its_sibling_does_not_end_the_wait(
    monkeypatch: pytest.MonkeyPatch, deadline: float
) -> None:
    laggard = _state("p1", 0, ISSUED + 1)  # refreshed, but counts no sibling yet
    asked = _answers(
        monkeypatch,
        [laggard, laggard, _state("p2", 1, ISSUED - 5), laggard, _state("p2", 1, ISSUED + 2)],
    )
    assert cli._every_process_loaded_since("http://lb", ISSUED, deadline)
    assert asked[0] == 5  # not before p2 had read the topology after the key was issued


def test_a_lone_process_is_believed_after_several_answers(
    monkeypatch: pytest.MonkeyPatch, deadline: float
) -> None:
    asked = _answers(monkeypatch, [_state("p1", 0, ISSUED + 1)])
    assert cli._every_process_loaded_since("http://lb", ISSUED, deadline)
    assert asked[0] == cli.LONE_PROCESS_ASKS


def test_a_balancer_without_shared_state_is_one_process(
    monkeypatch: pytest.MonkeyPatch, deadline: float
) -> None:
    asked = _answers(monkeypatch, [None, {"topology_loaded_at": ISSUED + 1, "redis": {}}])
    assert cli._every_process_loaded_since("http://lb", ISSUED, deadline)
    assert asked[0] == 2


def test_a_sibling_that_never_refreshes_runs_out_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _answers(monkeypatch, [_state("p1", 1, ISSUED + 1), _state("p2", 1, ISSUED - 5)])
    assert not cli._every_process_loaded_since("http://lb", ISSUED, time.monotonic() + 0.2)
