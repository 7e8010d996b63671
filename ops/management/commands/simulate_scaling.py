"""Replay spot traces under placement policies in virtual time (SkyServe §5.2):

    manage.py simulate_scaling --spot-trace PATH[,PATH...] \\
        --policy spothedge,even_spread,round_robin,on_demand [--n-target 4] [--n-extra 1] \\
        [--cold-start-s 183] [--preemption-warning-s 0] \\
        [--prices AWS_COST_DIR --instance-type p3.2xlarge]

    manage.py simulate_scaling --spot-trace PATH --demand SERVEGEN_MODEL_DIR --days 7-13 \\
        [--scaler request-rate,preserve] [--peak-rps 16] [--replica-rps 2]

With ``--demand``, each day of the ServeGen model is served under each scaling policy
with SpotHedge placing the replicas (``ops.scaling_demand``).

Each PATH is a SkyPilot trace file (one zone) or a folder of them (one trace per
instance type, its zones the files sharing it), or a 2020 availability event log
(``*.out``) or a folder of them: a folder's logs are merged into one multi-zone
timeline, one trace per instance type (``workers.scaling.spot_sources``), and the
command says so before its table.  Prints availability (share of time with at least N_tar
ready replicas) and cost relative to N_tar on-demand replicas, per trace and policy.
"""

from __future__ import annotations

from argparse import ArgumentParser
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ops.scaling_demand import format_demand, parse_days, run_demand
from workers.scaling.demand_sim import DemandConfig
from workers.scaling.fleet import ZoneOffer
from workers.scaling.prices import ON_DEMAND_LIST_PRICE, load_aws_spot_prices
from workers.scaling.registry import POLICIES
from workers.scaling.simulate import SimConfig, SimResult, simulate
from workers.scaling.spot_sources import load_spot_traces
from workers.scaling.traces import SpotTrace


@dataclass(frozen=True)
class Pricing:
    on_demand: float = 3.06
    spot_ratio: float = 0.3  # p3.2xlarge: ~$0.92 spot vs $3.06 on-demand
    spot_by_zone: dict[str, float] | None = None

    def offers(self, trace: SpotTrace) -> list[ZoneOffer]:
        by_zone = self.spot_by_zone or {}
        default = self.on_demand * self.spot_ratio
        return [
            ZoneOffer(zone, zone.rstrip("abcdef"), by_zone.get(zone, default), self.on_demand)
            for zone in trace.zones
        ]


def run_simulation(
    paths: list[str],
    policies: list[str],
    config: SimConfig,
    pricing: Pricing,
    notes: list[str] | None = None,
) -> list[SimResult]:
    """Every policy on every trace; what was merged to build them goes to ``notes``."""
    results = []
    for path in paths:
        traces, note = load_spot_traces(path)
        if note is not None and notes is not None:
            notes.append(note)
        for trace in traces:
            offers = pricing.offers(trace)
            results += [simulate(trace, policy, offers, config) for policy in policies]
    return results


def format_table(results: list[SimResult]) -> str:
    header = (
        f"{'trace':<34} {'policy':<12} {'availability':>12} {'cost/od':>8}"
        f" {'preempt':>8} {'launches':>8}"
    )
    rows = [header, "-" * len(header)]
    for r in results:
        rows.append(
            f"{r.trace:<34} {r.policy:<12} {r.availability:>11.1%} {r.relative_cost:>8.3f}"
            f" {r.preemptions:>8} {r.launches:>8}"
        )
    return "\n".join(rows)


class Command(BaseCommand):
    help = "Replay spot traces under scaling policies in virtual time; availability and cost."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--spot-trace", required=True, help="PATH[,PATH...]: files or folders")
        parser.add_argument("--policy", default="spothedge,even_spread,round_robin,on_demand")
        parser.add_argument("--n-target", type=int, default=4)
        parser.add_argument("--n-extra", type=int, default=1)
        parser.add_argument("--static-on-demand", type=int, default=1)
        parser.add_argument("--cold-start-s", type=float, default=183.0)
        parser.add_argument("--step-s", type=float, default=60.0)
        parser.add_argument(
            "--preemption-warning-s",
            type=float,
            default=0.0,
            help="notice before each spot preemption; the warned replica is drained at once",
        )
        parser.add_argument("--on-demand-price", type=float, default=None)
        parser.add_argument("--spot-ratio", type=float, default=0.3)
        parser.add_argument("--prices", default="", help="AWS spot price history folder")
        parser.add_argument("--instance-type", default="p3.2xlarge")
        parser.add_argument("--demand", default="", help="ServeGen model folder: a day's demand")
        parser.add_argument("--days", default="7-13", help="with --demand: FIRST-LAST or D,D")
        parser.add_argument("--scaler", default="request-rate,preserve")
        parser.add_argument("--peak-rps", type=float, default=16.0)
        parser.add_argument("--replica-rps", type=float, default=2.0)

    def handle(self, *args: Any, **options: Any) -> None:
        policies = [p.strip() for p in options["policy"].split(",") if p.strip()]
        unknown = sorted(set(policies) - set(POLICIES))
        if unknown:
            raise CommandError(f"unknown policy {unknown}; choose from {sorted(POLICIES)}")
        paths = [p for p in options["spot_trace"].split(",") if p]
        config = SimConfig(
            n_target=options["n_target"],
            n_extra=options["n_extra"],
            static_on_demand=options["static_on_demand"],
            cold_start_s=options["cold_start_s"],
            step_s=options["step_s"],
            warning_s=options["preemption_warning_s"],
        )
        if config.warning_s < 0:
            raise CommandError("--preemption-warning-s must be >= 0")
        notes: list[str] = []
        try:
            if options["demand"]:
                self.stdout.write(self._demand(paths, options))
                return
            results = run_simulation(paths, policies, config, self._pricing(options), notes)
        except (OSError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        for note in notes:
            self.stdout.write(note)
        self.stdout.write(format_table(results))

    def _demand(self, paths: list[str], options: dict[str, Any]) -> str:
        config = DemandConfig(
            peak_rps=options["peak_rps"],
            replica_rps=options["replica_rps"],
            cold_start_s=options["cold_start_s"],
            n_extra=options["n_extra"],
        )
        pricing = self._pricing(options)
        traces = [(t, pricing.offers(t)) for p in paths for t in load_spot_traces(p)[0]]
        scalers = [s.strip() for s in options["scaler"].split(",") if s.strip()]
        days = parse_days(options["days"])
        return format_demand(run_demand(Path(options["demand"]), days, traces, scalers, config))

    def _pricing(self, options: dict[str, Any]) -> Pricing:
        instance = options["instance_type"]
        on_demand = options["on_demand_price"] or ON_DEMAND_LIST_PRICE.get(instance, 3.06)
        spot = load_aws_spot_prices(options["prices"], instance) if options["prices"] else None
        return Pricing(on_demand=on_demand, spot_ratio=options["spot_ratio"], spot_by_zone=spot)
