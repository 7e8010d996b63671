"""Each request of a run as one row (``simulate --records``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from sim.des.calls import Journey
from sim.des.clients import RequestRecord
from sim.des.config import SimConfig
from sim.des.metrics import summarize
from sim.des.records import request_rows
from sim.des.world import SimRun, simulate


def test_one_row_per_request_that_adds_up_to_the_summary(
    make_config: Callable[..., SimConfig],
) -> None:
    run = simulate(make_config(policy="meridian", replicas={"us-east": 1, "eu-west": 1}))
    summary = summarize(run, "meridian", ttft_slo_s=0.5)
    rows = list(request_rows("meridian", run, 0.5))
    assert len(rows) == summary.issued == 30
    assert {row["run"] for row in rows} == {"meridian"}
    assert len({row["request_id"] for row in rows}) == 30
    sent = [row["sent_s"] for row in rows]
    assert sent == sorted(sent) and sent[0] == 0.0
    # What the summary counts, request by request.
    assert sum(row["met_slo"] for row in rows) == round(summary.slo_attainment * 30)
    assert sum(row["cached_tokens"] for row in rows) == summary.cached_tokens
    assert sum(row["prompt_tokens"] for row in rows if row["ok"]) == summary.prompt_tokens
    forwarded = sum(row["forwarded"] for row in rows if row["ok"])
    assert forwarded == round(summary.forwarded_share * summary.ok)
    for row in rows:
        assert row["status"] == 200 and row["ok"]
        assert row["ttft_s"] is not None and row["e2e_s"] >= row["ttft_s"] > 0
        assert row["met_slo"] == (row["ttft_s"] <= 0.5)
        # Served where its replica is: a forward crossed regions, a local answer did not.
        assert row["replica"].startswith(row["served_region"])
        assert row["forwarded"] == (row["served_region"] != row["client_region"])


def test_a_request_that_never_answered_has_no_latencies(
    make_config: Callable[..., SimConfig],
) -> None:
    config = make_config()
    lost = RequestRecord("r1", "us-east", 4.0, 100, journey=Journey(queue_wait=2.5))
    refused = RequestRecord("r0", "us-east", 3.0, 100, None, 3.1, False, 400)
    rows = list(request_rows("skylb", SimRun(config, [lost, refused], end_s=10.0), 2.0))
    assert [row["request_id"] for row in rows] == ["r0", "r1"]
    first, second = rows
    assert first["status"] == 400 and first["ttft_s"] is None
    assert first["e2e_s"] == 0.1 and not first["met_slo"]
    assert second["status"] is None  # still unfinished when the run ended
    assert second["sent_s"] == 1.0 and second["queue_wait_s"] == 2.5
    assert second["e2e_s"] is None and second["replica"] is None


def test_a_rows_program_and_step_link_each_turn_to_the_turn_before_it(
    make_config: Callable[..., SimConfig],
) -> None:
    run = simulate(make_config(policy="meridian", replicas={"us-east": 2}, clients={"us-east": 3}))
    rows = list(request_rows("meridian", run, 1.0))
    by_program: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_program.setdefault(str(row["program"]), []).append(row)
    # Named per region in start order; three clients run one conversation at a time.
    assert len(by_program) > 3 and all(name.startswith("us-east-p") for name in by_program)
    later_turns = 0
    for turns in by_program.values():
        # Rows come in send order, and a conversation's turns go one after another.
        assert [row["step"] for row in turns] == list(range(len(turns)))
        for before, after in itertools.pairwise(turns):
            # (Times are rounded to the microsecond.)
            assert after["sent_s"] >= before["sent_s"] + before["e2e_s"] - 2e-6
            # The next turn's prompt is the last one's, its reply and a new message.
            assert after["prompt_tokens"] > before["prompt_tokens"] + before["completion_tokens"]
            later_turns += 1
    assert later_turns > 0
