"""`manage.py replay`: send a workload's requests to a region's balancer (or any URL).

Examples::

    manage.py replay --workload conversations --region us-east --rate 2 --duration 60
    manage.py replay --workload tot:branching=4 --base-url http://127.0.0.1:8101 --clients 8
    manage.py replay --workload mooncake:trace.jsonl --region eu-west --speed 4 --max-requests 500

The work happens in ``ops.replay``; this command only turns options into a
``ReplayConfig``, shows progress (a tqdm bar on a terminal, plain status lines
into a pipe or with ``--no-progress``), and prints the summary.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any, Protocol, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.models import Balancer
from ops.progress import BudgetBar, bars_wanted, raw_stream
from ops.replay.display import StatusLine, format_summary
from ops.replay.sender import ReplayError
from ops.replay.service import ReplayConfig, run_replay
from ops.replay.stats import ReplaySnapshot
from sim.workloads import WORKLOAD_NAMES, TraceFormatError, WorkloadSpecError


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(raw: str) -> float | int:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not a {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {raw}")
        return value

    return parse


class Progress(Protocol):
    def update(self, snap: ReplaySnapshot) -> None: ...

    def close(self) -> None: ...


class ReplayBar:
    """A tqdm bar over the replay's budget (``--duration`` s, else ``--max-requests``),
    with the status line's numbers beside it."""

    def __init__(self, config: ReplayConfig, stream: TextIO) -> None:
        self.bar = BudgetBar(
            "replay", stream, duration_s=config.duration, max_requests=config.max_requests
        )

    def update(self, snap: ReplaySnapshot) -> None:
        note = f"ok {snap.ok} failed {snap.failed} {snap.requests_per_s:.1f} req/s"
        self.bar.advance(snap.elapsed, snap.sent, note)

    def close(self) -> None:
        self.bar.close()


class Command(BaseCommand):
    help = "Replay a synthetic workload or a trace against a Meridian region or any OpenAI URL."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--workload", required=True, help=f"one of: {', '.join(WORKLOAD_NAMES)}"
        )
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--region", help="send to this region's balancer (from the database)")
        target.add_argument("--base-url", help="send to this URL, e.g. http://127.0.0.1:8101")
        parser.add_argument("--api-key", help="client API key (default: $MERIDIAN_API_KEY)")
        parser.add_argument("--model", help="model name (default: the first the endpoint lists)")
        load = parser.add_mutually_exclusive_group()
        load.add_argument(
            "--rate", type=_positive(float), help="open loop: Poisson arrivals, programs/s"
        )
        load.add_argument(
            "--clients", type=_positive(int), help="closed loop: clients running one program each"
        )
        parser.add_argument(
            "--speed", type=_positive(float), default=1.0, help="trace time speed-up (default 1)"
        )
        parser.add_argument(
            "--ramp",
            type=float,
            default=0.0,
            help="closed loop: clients start evenly over this many seconds (default 0: at once)",
        )
        parser.add_argument("--duration", type=_positive(float), help="stop after this many s")
        parser.add_argument("--max-requests", type=_positive(int), help="send at most N requests")
        parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
        parser.add_argument("--quiet", action="store_true", help="no status line, summary only")
        parser.add_argument(
            "--no-progress",
            action="store_true",
            help="plain status lines instead of a progress bar on a terminal",
        )

    def handle(self, *args: object, **options: Any) -> None:
        config = self.build_config(options)
        self.quiet_http_logs()
        status: Progress | None = None
        if options["quiet"]:
            status = None
        elif bars_wanted(raw_stream(self.stderr), disabled=options["no_progress"]):
            status = ReplayBar(config, raw_stream(self.stderr))
        else:
            status = self.status_line(tty=not options["no_progress"])
        snapshot = self.replay(config, status)
        self.stdout.write(format_summary(snapshot))

    def build_config(self, options: dict[str, Any]) -> ReplayConfig:
        base_url = options["base_url"] or self.balancer_url(options["region"])
        return ReplayConfig(
            workload=options["workload"],
            base_url=base_url,
            api_key=options["api_key"] or os.environ.get("MERIDIAN_API_KEY", ""),
            model=options["model"],
            rate=options["rate"],
            clients=options["clients"],
            speed=options["speed"],
            duration=options["duration"],
            max_requests=options["max_requests"],
            seed=options["seed"],
            ramp=options["ramp"],
        )

    def balancer_url(self, region: str) -> str:
        """The URL of a balancer in ``region``, preferring one that is up."""
        balancers = Balancer.objects.filter(region__name=region).order_by("state", "name")
        up = balancers.filter(state=Balancer.State.UP).first()
        chosen = up or balancers.first()
        if chosen is None:
            known = sorted(set(Balancer.objects.values_list("region__name", flat=True)))
            regions = ", ".join(known) if known else "none: run the demo setup or add one in admin"
            raise CommandError(
                f"no balancer in region {region!r} (regions with balancers: {regions}); "
                "use --base-url to send elsewhere"
            )
        return chosen.url

    def quiet_http_logs(self) -> None:
        # The SDK's HTTP library logs every request at INFO; at replay rates that
        # would bury the status line.  Warnings and errors still show.
        logging.getLogger("httpx2").setLevel(logging.WARNING)

    def status_line(self, *, tty: bool) -> StatusLine:
        # Progress goes to stderr so stdout carries only the summary.
        return StatusLine(
            lambda text: self.stderr.write(text, ending=""),
            tty=tty and self.stderr.isatty(),
            flush=self.stderr.flush,
        )

    def replay(self, config: ReplayConfig, status: Progress | None) -> ReplaySnapshot:
        try:
            return asyncio.run(
                run_replay(
                    config,
                    on_tick=status.update if status else None,
                    announce=lambda line: self.stdout.write(line),
                )
            )
        except (WorkloadSpecError, TraceFormatError, ReplayError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if status is not None:
                status.close()
