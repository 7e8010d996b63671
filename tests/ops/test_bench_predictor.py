"""``manage.py bench predictor``: on a small ShareGPT-shaped trace made here, a row per
predictor with every column, and a saved state the balancer can start from.

No timing and no accuracy level is asserted (those live in docs/benchmarks.md).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from core.predictors import build_predictor
from tests.support.commands import run_command


def _trace(path: Path, conversations: int = 40) -> Path:
    """Conversations where "summarize" gets a short answer and "essay" a long one."""
    lines = []
    for k in range(conversations):
        ask, answer = ("summarize this", "ok " * 5) if k % 2 else ("write an essay", "word " * 80)
        turns = [{"from": "human", "value": f"{ask} {k}"}, {"from": "gpt", "value": answer}] * 2
        lines.append(json.dumps({"id": f"c{k}", "conversations": turns}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_row_per_predictor_and_a_state_to_start_from(tmp_path: Path) -> None:
    saved = tmp_path / "predictor.state"
    out = run_command(
        "bench", "predictor", "--trace", str(_trace(tmp_path / "t.jsonl")), "--save", str(saved)
    )
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| ")]
    header, *body = [[cell.strip() for cell in row] for row in rows]
    assert header == ["predictor", "MAE", "Acc-25", "Acc-50", "Acc-100", "us p50", "us p99"]
    assert [row[0] for row in body] == ["none", "session-mean", "learned"]
    assert all(row[2].endswith("%") for row in body)
    assert "one 4k-token prompt" in out
    learned = build_predictor("learned", saved.read_bytes())
    assert learned.name == "learned"


def test_a_trace_with_no_test_conversations_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="both sides of the split"):
        call_command(
            "bench", "predictor", "--trace", str(_trace(tmp_path / "t.jsonl", 1)),
            stdout=io.StringIO(),
        )  # fmt: skip
