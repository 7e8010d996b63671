"""`manage.py simulate`: run routing policies through the discrete-event simulator.

    manage.py simulate --workload conversations --policies rr,ll,ch,sglang,skylb_ch,skylb \\
        --replicas us-east=4,eu-west=3,ap-southeast=2 --clients 40 --duration 300 --seed 1
    manage.py simulate --experiment fig9 --duration 300

Prints one table row per run (throughput, TTFT and end-to-end p50/p90/p99, KV hit
rate, outstanding variance, share forwarded, queue waits) and saves a
self-contained plotly report under ``VAR_DIR/simulations/`` (or ``--report``).
The simulation itself is ``sim.des``; this command only parses and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from routing.core.predictors import SIM_PREDICTORS
from routing.core.registry import UnknownPolicyError
from sim.des.config import DEPLOYMENTS, SimConfigError
from sim.des.experiments import EXPERIMENTS, experiment
from sim.des.metrics import Summary
from sim.des.plan import PUSHING_CHOICES, RunPlan, build_plan, execute
from sim.des.report import format_table, save_report
from sim.des.world import SimRun
from sim.engine import PROFILES
from sim.workloads import TraceFormatError, WorkloadSpecError


class Command(BaseCommand):
    help = "Simulate routing policies in virtual time on the real routing core and engine model."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workload", help="conversations, tot:branching=4, a+b, mooncake:PATH…"
        )
        parser.add_argument("--experiment", choices=sorted(EXPERIMENTS))
        parser.add_argument("--policies", default="skylb", help="comma list; rr/ll/p2c/ch aliases")
        parser.add_argument("--pushing", default="auto", help=f"comma list of {PUSHING_CHOICES}")
        parser.add_argument(
            "--param",
            action="append",
            default=[],
            type=_param,
            metavar="KEY=VALUE",
            help="policy parameter or push_budget, as ServiceConfig.policy_params",
        )
        parser.add_argument("--deployment", default="auto", choices=DEPLOYMENTS)
        parser.add_argument("--replicas", default="us-east=4,eu-west=3,ap-southeast=2")
        parser.add_argument("--clients", help="closed loop: N per region or REGION=N,...")
        parser.add_argument("--rate", help="open loop: programs/s per region or REGION=R,...")
        parser.add_argument("--duration", type=float, help="virtual seconds clients send for")
        parser.add_argument("--requests", type=int, help="stop sending after this many requests")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--profile", default="l4-llama3.1-8b", choices=sorted(PROFILES))
        parser.add_argument("--time-scale", type=float, default=1.0)
        parser.add_argument("--speed", type=float, default=1.0, help="trace timestamps / speed")
        parser.add_argument("--max-outstanding", type=int, default=32, help="SP-O cap")
        parser.add_argument("--single-region", help="where a single balancer runs")
        parser.add_argument(
            "--length-predictor",
            default="none",
            choices=SIM_PREDICTORS,
            help="response-length predictor of the balancers' load forecast (oracle: the truth)",
        )
        parser.add_argument("--rtt", help="A:B=MS,... (default: the demo's RTTs)")
        parser.add_argument("--report", type=Path, help="HTML path (default: VAR_DIR/simulations/)")
        parser.add_argument("--json", type=Path, help="also write the summaries as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            plan = self.plan(options)
            summaries = execute(plan, self.progress)
        except (SimConfigError, UnknownPolicyError, WorkloadSpecError, TraceFormatError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(format_table(summaries))
        shown = {k: v for k, v in options.items() if k in _SHOWN and v is not None}
        path = save_report(settings.VAR_DIR, plan.title, shown, summaries, options["report"])
        self.stdout.write(f"report: {path}")
        if options["json"] is not None:
            options["json"].write_text(json.dumps([s.as_dict() for s in summaries], indent=1))

    def plan(self, options: dict[str, Any]) -> RunPlan:
        options = {**options, "param": dict(options["param"])}
        if options["experiment"]:
            preset = experiment(options["experiment"], options["duration"], options["seed"])
            predictor = options.get("length_predictor") or "none"
            runs = [(k, dataclasses.replace(c, length_predictor=predictor)) for k, c in preset.runs]
            return RunPlan(preset.title, runs)
        if not options["workload"]:
            raise SimConfigError("give --workload (or --experiment)")
        return build_plan(options)

    def progress(self, label: str, run: SimRun, summary: Summary) -> None:
        stats = run.stats
        self.stderr.write(
            f"{label}: {summary.issued} requests, {summary.makespan_s:.0f} virtual s "
            f"in {stats.wall_s:.1f} wall s ({stats.events} events)"
        )


def _param(raw: str) -> tuple[str, Any]:
    """``key=value``, the value read as JSON when it parses (numbers, booleans)."""
    key, sep, value = raw.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {raw!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


_SHOWN = (
    "workload", "experiment", "policies", "pushing", "deployment", "replicas", "clients",
    "rate", "duration", "requests", "seed", "profile", "time_scale", "max_outstanding", "param",
    "length_predictor",
)  # fmt: skip
