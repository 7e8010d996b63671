"""One call to replay a workload against an endpoint: what the command and the demo use.

``run_replay(ReplayConfig(...))`` parses the workload, picks the arrival process,
opens one SDK client, finds the model if none was given, and runs a
``ReplayRunner`` until it ends or SIGINT/SIGTERM stops it.  It knows nothing about
Django: the ``replay`` command resolves ``--region`` to a URL first.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ops.replay.runner import ReplayLimits, ReplayRunner, stop_on_signals
from ops.replay.sender import OpenAISender, first_model, make_client
from ops.replay.stats import ReplaySnapshot
from sim.workloads import Arrivals, Workload, choose_arrivals, parse_workload

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class ReplayConfig:
    """Everything a replay needs; mirrors the command's options."""

    workload: str
    base_url: str
    api_key: str = ""
    model: str | None = None
    rate: float | None = None
    clients: int | None = None
    speed: float = 1.0
    duration: float | None = None
    max_requests: int | None = None
    seed: int = 0
    ramp: float = 0.0
    request_timeout: float = 300.0

    def build_workload(self) -> Workload:
        """The workload; raises ``WorkloadSpecError`` for a bad ``workload`` value."""
        return parse_workload(self.workload, seed=self.seed)

    def build_arrivals(self, workload: Workload) -> Arrivals:
        """The arrival process; raises ``ValueError`` for contradictory options."""
        return choose_arrivals(
            workload,
            rate=self.rate,
            clients=self.clients,
            speed=self.speed,
            seed=self.seed,
            ramp_s=self.ramp,
        )

    @property
    def limits(self) -> ReplayLimits:
        return ReplayLimits(duration=self.duration, max_requests=self.max_requests)


async def run_replay(
    config: ReplayConfig,
    *,
    on_tick: Callable[[ReplaySnapshot], None] | None = None,
    announce: Callable[[str], None] | None = None,
    signals: Iterable[int] = STOP_SIGNALS,
) -> ReplaySnapshot:
    """Replay ``config.workload`` against ``config.base_url`` and return the totals.

    Raises ``WorkloadSpecError``/``ValueError`` for bad options before sending
    anything, ``ReplayError`` (``ApiKeyRejected``) when the endpoint cannot be used,
    and ``TraceFormatError`` when a trace file turns out malformed part-way.
    """
    workload = config.build_workload()
    arrivals = config.build_arrivals(workload)
    async with make_client(
        config.base_url, config.api_key, timeout=config.request_timeout
    ) as client:
        model = config.model or await first_model(client)
        if announce is not None:
            announce(
                f"Replaying {config.workload} against {client.base_url}: model {model}, "
                f"{arrivals.describe()}"
            )
        runner = ReplayRunner(
            workload.programs(),
            arrivals,
            OpenAISender(client, model),
            limits=config.limits,
            on_tick=on_tick,
        )
        with stop_on_signals(runner, signals):
            return await runner.run()


def demo_replay_argv(
    region: str,
    *,
    workload: str = "conversations",
    rate: float = 1.0,
    seed: int = 0,
    api_key: str | None = None,
) -> list[str]:
    """Arguments after ``manage.py`` for steady demo traffic into one region.

    Meant for a child process (``[sys.executable, "manage.py", *demo_replay_argv(...)]``)
    that runs until terminated: no duration, no request limit, plain status lines
    because its output goes to a log.  Without ``api_key`` the child reads
    ``MERIDIAN_API_KEY`` from its environment, which keeps the key off the process list.
    """
    argv = ["replay", "--workload", workload, "--region", region, "--rate", f"{rate:g}"]
    argv += ["--seed", str(seed)]
    if api_key:
        argv += ["--api-key", api_key]
    return argv
