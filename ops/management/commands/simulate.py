"""`manage.py simulate`: run routing policies through the discrete-event simulator.

    manage.py simulate --workload conversations --policies rr,ll,ch,sglang,skylb_ch,skylb \\
        --replicas us-east=4,eu-west=3,ap-southeast=2 --clients 40 --duration 300 --seed 1
    manage.py simulate --experiment fig9 --duration 300

Prints one table row per run, ranked by goodput (requests/s meeting ``--ttft-slo``,
rejections and drops counted as misses), with throughput, TTFT and end-to-end
p50/p90/p99, KV hit rate and its oracle bound, outstanding variance, share
forwarded and queue waits, and saves a plotly report under
``VAR_DIR/simulations/`` (or ``--report``).  A progress bar per run shows on a
terminal unless ``--no-progress``.  ``--records PATH`` also writes every request of
every run as one JSON line (``sim.des.records``): which missed, where each went.
The simulation itself is ``sim.des``; this command only parses and prints.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, TextIO

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.predictors import SIM_PREDICTORS
from core.registry import DEFAULT_POLICY, UnknownPolicyError
from ops.params import add_param_argument
from ops.progress import BudgetBar, bars_wanted, raw_stream
from sim.des.config import DEFAULT_TTFT_SLO_S, DEPLOYMENTS, SimConfig, SimConfigError
from sim.des.experiments import EXPERIMENTS, experiment
from sim.des.metrics import Summary
from sim.des.plan import (
    DEFAULT_PROFILE,
    PUSHING_CHOICES,
    RunPlan,
    build_plan,
    engine_config,
    engine_overridden,
    execute,
    with_engine,
)
from sim.des.records import request_rows
from sim.des.report import format_table, save_report
from sim.des.world import SimRun, SliceHook
from sim.engine import PROFILES
from sim.engine.schedule_policy import SchedulePolicy
from sim.workloads import TraceFormatError, WorkloadSpecError


class Command(BaseCommand):
    help = "Simulate routing policies in virtual time on the real routing core and engine model."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workload", help="conversations, tot:branching=4, a+b, mooncake:PATH…"
        )
        parser.add_argument("--experiment", choices=sorted(EXPERIMENTS))
        parser.add_argument(
            "--policies", default=DEFAULT_POLICY, help="comma list; rr/ll/p2c/ch aliases"
        )
        parser.add_argument("--pushing", default="auto", help=f"comma list of {PUSHING_CHOICES}")
        add_param_argument(
            parser, "policy parameter or push_budget, as ServiceConfig.policy_params"
        )
        parser.add_argument("--deployment", default="auto", choices=DEPLOYMENTS)
        parser.add_argument("--replicas", default="us-east=4,eu-west=3,ap-southeast=2")
        parser.add_argument("--clients", help="closed loop: N per region or REGION=N,...")
        parser.add_argument("--rate", help="open loop: programs/s per region or REGION=R,...")
        parser.add_argument("--duration", type=float, help="virtual seconds clients send for")
        parser.add_argument("--requests", type=int, help="stop sending after this many requests")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument(
            "--profile",
            default=DEFAULT_PROFILE,
            choices=sorted(PROFILES),
            help="engine regime: step times and KV/context shape (docs/simulator.md)",
        )
        parser.add_argument("--kv-tokens", type=int, help="KV cache per replica, in tokens")
        parser.add_argument("--kv-blocks", type=int, help="KV cache per replica, in blocks")
        parser.add_argument("--max-model-len", type=int, help="context limit per request")
        parser.add_argument(
            "--schedule-policy",
            default=SchedulePolicy.FCFS.value,
            choices=[policy.value for policy in SchedulePolicy],
            help="the engines' waiting order: fcfs (vLLM), priority (vLLM's, by each "
            "request's priority) or lpm (SGLang's longest prefix match)",
        )
        parser.add_argument("--time-scale", type=float, default=1.0)
        parser.add_argument("--speed", type=float, default=1.0, help="trace timestamps / speed")
        parser.add_argument(
            "--ramp",
            type=float,
            default=0.0,
            help="closed loop: clients start evenly over this many seconds (default 0: at once)",
        )
        parser.add_argument("--max-outstanding", type=int, default=32, help="SP-O cap")
        parser.add_argument("--single-region", help="where a single balancer runs")
        parser.add_argument(
            "--length-predictor",
            default="none",
            choices=SIM_PREDICTORS,
            help="response-length predictor of the balancers' load forecast (oracle: the truth)",
        )
        parser.add_argument("--rtt", help="A:B=MS,... (default: the demo's RTTs)")
        parser.add_argument(
            "--ttft-slo",
            type=float,
            default=DEFAULT_TTFT_SLO_S,
            help=f"goodput counts answers with TTFT <= this (s, default {DEFAULT_TTFT_SLO_S:g})",
        )
        parser.add_argument(
            "--no-progress", action="store_true", help="no progress bar (none off a terminal)"
        )
        parser.add_argument("--report", type=Path, help="HTML path (default: VAR_DIR/simulations/)")
        parser.add_argument("--json", type=Path, help="also write the summaries as JSON")
        parser.add_argument(
            "--records",
            type=Path,
            help="also write every request of every run as JSON Lines (sim.des.records)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["ttft_slo"] <= 0:
            raise CommandError("--ttft-slo must be positive")
        self.bar: BudgetBar | None = None
        slo_s = options["ttft_slo"]
        stream = raw_stream(self.stderr)
        watch = self.watch if bars_wanted(stream, disabled=options["no_progress"]) else None
        try:
            plan = self.plan(options)
            # Opened before the runs: a path that cannot be written fails now, not after them.
            with _records_file(options["records"]) as records:
                progress = self.progress_writing(records, slo_s)
                summaries = execute(plan, progress, ttft_slo_s=slo_s, watch=watch)
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
            plan = experiment(options["experiment"], options["duration"], options["seed"])
            if engine_overridden(options):  # the same experiment in another engine regime
                plan = with_engine(plan, engine_config(options))
            predictor = options.get("length_predictor") or "none"
            runs = [(k, dataclasses.replace(c, length_predictor=predictor)) for k, c in plan.runs]
            return RunPlan(plan.title, runs)
        if not options["workload"]:
            raise SimConfigError("give --workload (or --experiment)")
        return build_plan(options)

    def watch(self, label: str, config: SimConfig) -> SliceHook:
        """A bar for the run about to start: virtual seconds (or requests) of its budget."""
        bar = self.bar = BudgetBar(
            label,
            raw_stream(self.stderr),
            duration_s=config.duration_s,
            max_requests=config.max_requests,
            seconds_unit="virtual s",
        )
        return lambda virtual_s, sent: bar.advance(virtual_s, sent, f"{sent} requests")

    def progress_writing(
        self, records: TextIO | None, ttft_slo_s: float
    ) -> Callable[[str, SimRun, Summary], None]:
        """``progress``, and each run's requests written to ``records`` as it ends."""

        def progress(label: str, run: SimRun, summary: Summary) -> None:
            self.progress(label, run, summary)
            if records is not None:
                rows = request_rows(label, run, ttft_slo_s)
                records.writelines(json.dumps(row) + "\n" for row in rows)

        return progress

    def progress(self, label: str, run: SimRun, summary: Summary) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        stats = run.stats
        self.stderr.write(
            f"{label}: {summary.issued} requests, {summary.makespan_s:.0f} virtual s "
            f"in {stats.wall_s:.1f} wall s ({stats.events} events)"
        )


def _records_file(path: Path | None) -> AbstractContextManager[TextIO | None]:
    """``--records``' file, opened for writing (nothing when it is not asked for)."""
    if path is None:
        return nullcontext()
    try:
        return path.open("w", encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write --records {path}: {exc.strerror}") from exc


_SHOWN = (
    "workload", "experiment", "policies", "pushing", "deployment", "replicas", "clients",
    "rate", "ramp", "duration", "requests", "seed", "profile", "kv_tokens", "kv_blocks",
    "max_model_len", "schedule_policy", "time_scale", "max_outstanding", "param", "ttft_slo",
    "length_predictor",
)  # fmt: skip
