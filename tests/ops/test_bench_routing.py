"""``manage.py bench routing --quick``: every policy gets a row, every table prints.

No timing is asserted (timing claims live in the benchmark's own output).
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from core.registry import policy_names
from tests.support.commands import run_command


def test_quick_run_prints_a_row_per_policy_and_every_table() -> None:
    lines = run_command("bench", "routing", "--quick", "--seed", "3").splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["policy", "targets"])
    rows = [line.split() for line in lines[header + 1 :] if line.strip()]
    rows = rows[: next(i for i, r in enumerate(rows) if r[0] == "tokenization")]
    assert sorted({r[0] for r in rows}) == policy_names()
    assert {r[1] for r in rows} == {"8", "64"}
    assert all(len(r) == 9 for r in rows)  # policy, targets, 3 x (p50, p99), verdict
    assert any(line.startswith("8192 ") for line in lines)  # tokenization row
    memory = [line.split() for line in lines if line.split()[-1:] in (["yes"], ["NO"])]
    # One row per structure, and each stayed within its configured bound.
    assert [m[0] for m in memory] == ["skylb", "sglang", "cache"]
    assert all(m[-1] == "yes" for m in memory)
    # The whole decision: model tokenizer and fallback, a fresh conversation and its
    # follow-up turn, for each of the three prompt sizes.
    decisions = [line.split() for line in lines if line.split()[:1] in (["model"], ["fallback"])]
    assert [d[:2] for d in decisions] == [
        ["model", "fresh"], ["model", "follow-up"], ["fallback", "fresh"], ["fallback", "follow-up"]
    ] * 3  # fmt: skip
    assert all(len(d) == 8 and int(d[-1]) > 0 for d in decisions)
    # A follow-up turn is its conversation plus two new messages: more tokens.
    assert all(int(up[2]) > int(fresh[2]) for fresh, up in zip(decisions[::2], decisions[1::2]))


def test_cpu_time_says_which_clock_timed_the_decisions() -> None:
    wall = run_command("bench", "routing", "--quick", "--policies", "meridian").splitlines()
    cpu = run_command("bench", "routing", "--quick", "--policies", "meridian", "--cpu-time")
    assert "wall-clock microseconds" in wall[0]
    lines = cpu.splitlines()
    assert "thread CPU microseconds" in lines[0]
    rows = [line.split() for line in lines[2:4]]
    assert [r[:2] for r in rows] == [["meridian", "8"], ["meridian", "64"]]
    assert all(float(cell) > 0 for r in rows for cell in r[2:8])


def test_unknown_policies_are_refused() -> None:
    with pytest.raises(CommandError, match="unknown policies: nope"):
        call_command("bench", "routing", "--quick", "--policies", "nope", stdout=io.StringIO())


def test_a_param_reaches_every_policy_measured() -> None:
    out = run_command(
        "bench", "routing", "--quick", "--policies", "meridian",
        "--param", "tree_from_kv_events=true",
    )  # fmt: skip
    rows = [line.split() for line in out.splitlines()[2:4]]
    assert [r[:2] for r in rows] == [["meridian", "8"], ["meridian", "64"]]
    # The policy is built with it: a value its config refuses fails the run.
    with pytest.raises(CommandError, match="max_blocks_per_target must be positive"):
        run_command(
            "bench", "routing", "--quick", "--policies", "meridian",
            "--param", "max_blocks_per_target=0",
        )  # fmt: skip
