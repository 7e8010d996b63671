"""The simulator's own speed: simulated requests per wall second, cost per event, memory.

Two scenarios, each in a fresh child process so its peak RSS is its own:

* ``9 replicas``: the demo's fleet (us-east 4, eu-west 3, ap-southeast 2), SkyLB,
  Poisson arrivals of single-turn requests behind shared system prompts at
  12,000 per hour, for one virtual hour (the target: under a minute of wall time);
* ``1000 replicas``: ten regions of 100 replicas, SkyLB with forwarding, Poisson
  arrivals in every region, for ``--big-duration`` virtual seconds: that it runs
  at all, within memory, and what one event costs at that scale.

Every run is the real routing core and engine model (``sim.des``); what it costs
per event is mostly engine steps (one per replica per modeled forward pass) and
SP-P's probes (every replica, every 0.25 s, plus early re-probes while requests
wait).
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from sim.des.config import SimConfig
from sim.des.metrics import summarize
from sim.des.world import simulate

WORKLOAD = "system-prompts"
DEMO_FLEET = {"us-east": 4, "eu-west": 3, "ap-southeast": 2}


@dataclass(frozen=True)
class Measurement:
    label: str
    requests: int
    virtual_s: float
    wall_s: float
    events: int
    engine_steps: int
    probes: int
    peak_rss_mib: float

    @property
    def requests_per_wall_s(self) -> float:
        return self.requests / self.wall_s

    @property
    def us_per_event(self) -> float:
        return 1e6 * self.wall_s / max(1, self.events)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=3600.0, help="9-replica virtual s")
    parser.add_argument("--per-hour", type=float, default=12_000.0, help="9-replica load")
    parser.add_argument("--big-duration", type=float, default=30.0, help="1000-replica virtual s")
    parser.add_argument("--big-rate", type=float, default=20.0, help="programs/s per region")
    parser.add_argument("--skip-big", action="store_true", help="only the 9-replica run")
    parser.add_argument("--seed", type=int, default=0)


def scenarios(options: dict[str, Any]) -> list[tuple[str, SimConfig]]:
    rate = float(options["per_hour"]) / 3600.0 / len(DEMO_FLEET)
    small = SimConfig(
        workload=WORKLOAD,
        policy="skylb",
        replicas=DEMO_FLEET,
        rate=dict.fromkeys(DEMO_FLEET, rate),
        duration_s=float(options["duration"]),
        seed=int(options["seed"]),
    )
    runs = [("9 replicas, 3 regions", small)]
    if not options.get("skip_big"):
        regions = {f"region-{i}": 100 for i in range(10)}
        big = SimConfig(
            workload=WORKLOAD,
            policy="skylb",
            replicas=regions,
            rate=dict.fromkeys(regions, float(options["big_rate"])),
            duration_s=float(options["big_duration"]),
            seed=int(options["seed"]),
        )
        runs.append(("1000 replicas, 10 regions", big))
    return runs


def measure(label: str, config: SimConfig) -> Measurement:
    """One run; meant for a fresh process (``ru_maxrss`` is the process's peak)."""
    run = simulate(config)
    summary = summarize(run, label)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return Measurement(
        label,
        summary.issued,
        run.end_s,
        run.stats.wall_s,
        run.stats.events,
        run.stats.engine_steps,
        run.stats.probes,
        peak_kib / 1024.0,
    )


def run(options: dict[str, Any], stdout: TextIO) -> None:
    context = multiprocessing.get_context("spawn")
    header = (
        f"{'scenario':<28}{'requests':>9}{'virtual s':>10}{'wall s':>8}{'req/wall s':>11}"
        f"{'events':>10}{'us/event':>9}{'steps':>10}{'probes':>9}{'peak MiB':>9}"
    )
    stdout.write(header + "\n")
    for label, config in scenarios(options):
        with context.Pool(1) as pool:
            m = pool.apply(measure, (label, config))
        stdout.write(
            f"{m.label:<28}{m.requests:>9}{m.virtual_s:>10.0f}{m.wall_s:>8.2f}"
            f"{m.requests_per_wall_s:>11.0f}{m.events:>10}{m.us_per_event:>9.1f}"
            f"{m.engine_steps:>10}{m.probes:>9}{m.peak_rss_mib:>9.0f}\n"
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m ops.bench.sim``: the same table without Django."""
    parser = argparse.ArgumentParser(prog="python -m ops.bench.sim", description=__doc__)
    add_arguments(parser)
    run(vars(parser.parse_args(argv)), sys.stdout)


if __name__ == "__main__":
    main()
