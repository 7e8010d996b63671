"""`manage.py simulate`: options to runs, the table on stdout, the report on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError

from ops.management.commands.simulate import Command
from sim.des.experiments import EXPERIMENTS, experiment
from sim.des.plan import build_plan
from tests.support.commands import run_command

SMALL = [
    "--workload",
    "conversations:system_tokens=64,users=4,turns_max=2,max_tokens_min=4,max_tokens_max=8",
    "--replicas",
    "us-east=2,eu-west=1",
    "--clients",
    "2",
    "--requests",
    "10",
    "--seed",
    "2",
]


def simulate(*args: str) -> str:
    return run_command("simulate", *args)


def test_one_row_per_policy_and_pushing_and_a_saved_report(tmp_path: Path) -> None:
    report, summaries = tmp_path / "r.html", tmp_path / "s.json"
    text = simulate(
        *SMALL, "--policies", "rr,skylb", "--pushing", "sp-p,blind",
        "--report", str(report), "--json", str(summaries),
    )  # fmt: skip
    rows = [line.split()[:2] for line in text.splitlines()[1:5]]
    data = json.loads(summaries.read_text())
    assert [d["ok"] for d in data] == [10, 10, 10, 10]
    # Rows are ranked by goodput (the JSON keeps the run order).
    ranked = sorted(data, key=lambda d: -d["goodput_rps"])
    assert rows == [d["label"].split() for d in ranked]
    assert sorted(map(tuple, rows)) == [
        ("round_robin", "blind"),
        ("round_robin", "sp-p"),
        ("skylb", "blind"),
        ("skylb", "sp-p"),
    ]
    assert f"report: {report}" in text
    assert report.is_file() and report.with_suffix(".json").is_file()


def test_engine_flags_shape_the_replicas_and_rejections_are_a_column(tmp_path: Path) -> None:
    summaries = tmp_path / "s.json"
    text = simulate(
        *SMALL, "--policies", "ll", "--max-model-len", "40", "--kv-tokens", "4096",
        "--ttft-slo", "0.5", "--report", str(tmp_path / "r.html"), "--json", str(summaries),
    )  # fmt: skip
    header, row = text.splitlines()[:2]
    assert header.split()[:4] == ["policy", "ok", "rej", "drop"]
    (data,) = json.loads(summaries.read_text())
    assert data["rejected"] > 0 and int(row.split()[2]) == data["rejected"]
    assert data["ttft_slo_s"] == 0.5
    title = json.loads((tmp_path / "r.json").read_text())["title"]
    assert title.endswith("[l4-llama3.1-8b, KV 4,096 tokens, context 40]")


def test_an_experiment_runs_in_another_engine_regime(tmp_path: Path) -> None:
    from ops.management.commands.simulate import Command

    options = {"experiment": "fig9", "duration": 5.0, "seed": 1, "param": [],
               "profile": "l4-llama3.1-8b-small-kv", "kv_tokens": None, "kv_blocks": None,
               "max_model_len": None}  # fmt: skip
    plan = Command().plan(options)
    assert all(config.engine.num_blocks == 512 for _, config in plan.runs)
    assert plan.title.endswith("[l4-llama3.1-8b-small-kv, KV 8,192 tokens, context 8,192]")


def test_the_engines_may_schedule_as_sglang_does(tmp_path: Path) -> None:
    from sim.engine.schedule_policy import SchedulePolicy

    options = {"experiment": "fig9", "duration": 5.0, "seed": 1, "param": [],
               "profile": None, "kv_tokens": None, "kv_blocks": None,
               "max_model_len": None, "schedule_policy": "lpm"}  # fmt: skip
    plan = Command().plan(options)
    assert all(config.engine.schedule_policy is SchedulePolicy.LPM for _, config in plan.runs)
    assert plan.title.endswith("context 8,192, longest prefix first]")
    # A workload run too, with the flag as typed (the default is vLLM's order).
    text = simulate(*SMALL, "--policies", "ll", "--schedule-policy", "lpm",
                    "--report", str(tmp_path / "r.html"))  # fmt: skip
    title = json.loads((tmp_path / "r.json").read_text())["title"]
    assert title.endswith("longest prefix first]") and "report:" in text
    default = Command().plan({**options, "schedule_policy": "fcfs"})
    assert "longest prefix" not in default.title
    with pytest.raises(CommandError, match="schedule-policy"):
        simulate(*SMALL, "--schedule-policy", "sjf")


def test_reports_go_under_var_dir_by_default(tmp_path: Path, settings: Any) -> None:
    settings.VAR_DIR = tmp_path
    text = simulate(*SMALL, "--policies", "ll")
    (page,) = (tmp_path / "simulations").glob("*.html")
    assert f"report: {page}" in text


def test_records_hold_every_request_of_every_run(tmp_path: Path) -> None:
    records, summaries = tmp_path / "requests.jsonl", tmp_path / "s.json"
    simulate(
        *SMALL, "--policies", "rr,meridian", "--ttft-slo", "0.5",
        "--report", str(tmp_path / "r.html"), "--json", str(summaries),
        "--records", str(records),
    )  # fmt: skip
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    data = json.loads(summaries.read_text())
    # One line per request, run by run in the order they ran.
    assert [row["run"] for row in rows] == [d["label"] for d in data for _ in range(d["issued"])]
    for d in data:
        mine = [row for row in rows if row["run"] == d["label"]]
        assert sum(row["met_slo"] for row in mine) == round(d["slo_attainment"] * d["issued"])
        assert sum(row["cached_tokens"] for row in mine) == d["cached_tokens"]


def test_an_unwritable_records_path_fails_before_any_run(tmp_path: Path) -> None:
    report, missing = tmp_path / "r.html", tmp_path / "missing" / "requests.jsonl"
    with pytest.raises(CommandError, match="cannot write --records"):
        simulate(*SMALL, "--report", str(report), "--records", str(missing))
    assert not list(tmp_path.iterdir())  # no report: nothing ran


def test_a_bad_option_leaves_no_records_file(tmp_path: Path) -> None:
    records = tmp_path / "requests.jsonl"
    with pytest.raises(CommandError, match="unknown policy 'nope'"):
        simulate(*SMALL, "--policies", "nope", "--records", str(records))
    assert not records.exists()  # the plan failed before the file was opened


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "nope"], "unknown policy 'nope'"),
        (["--pushing", "sideways"], "--pushing"),
        (["--replicas", "us-east"], "--replicas"),
        (["--clients", "mars=3"], "without a balancer"),
        (["--workload", "chatter"], "unknown workload"),
        (["--param", "push_budget=0"], "push_budget must be at least 1"),
        (["--param", "nope=1"], "has no parameter"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        simulate(*SMALL, *args)


def test_policy_params_and_the_push_budget_reach_the_service(tmp_path: Path) -> None:
    report = tmp_path / "r.html"
    simulate(
        *SMALL,
        "--policies",
        "skylb",
        "--param",
        "push_budget=4",
        "--param",
        "min_match_ratio=0.3",
        "--report",
        str(report),
    )
    (summary,) = json.loads(report.with_suffix(".json").read_text())["summaries"]
    assert summary["ok"] == 10


def test_a_workload_or_an_experiment_is_needed() -> None:
    with pytest.raises(CommandError, match="--workload"):
        simulate("--duration", "5")


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_experiments_plan_the_papers_runs(name: str) -> None:
    plan = experiment(name, 60.0, seed=1)
    labels = [label for label, _ in plan.runs]
    expected = {
        "fig8-conversations": 6, "fig8-tot": 6, "fig8-mixed": 6, "fig9": 3, "fig10": 8,
    }  # fmt: skip
    assert len(labels) == expected[name] == len(set(labels))
    assert all(config.duration_s == 60.0 for _, config in plan.runs)


def test_the_documented_command_line_reproduces_a_preset_run() -> None:
    # docs/results.md varies one preset run from the command line: it must be the same run.
    argv = [
        "--workload", "tot:branching=2,depth=4", "--policies", "skylb",
        "--replicas", "us-east=4,eu-west=4,ap-southeast=4",
        "--clients", "us-east=40,eu-west=20,ap-southeast=20", "--duration", "300", "--seed", "1",
    ]  # fmt: skip
    parser = Command().create_parser("manage.py", "simulate")
    options = vars(parser.parse_args(argv))
    ((_, from_cli),) = build_plan({**options, "param": dict(options["param"])}).runs
    *_, (label, preset) = experiment("fig8-tot", 300.0, seed=1).runs
    assert label == "SkyLB"
    assert from_cli == preset
