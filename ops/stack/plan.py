"""What the run command starts: the child processes of the demo stack and their settings."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ops.demo import DEMO_MODEL, DEMO_REGIONS, DemoTopology
from ops.stack.supervisor import ChildSpec, python_argv

BIN_DIR = Path(sys.executable).parent


@dataclass(frozen=True)
class StackOptions:
    host: str
    console_port: int
    balancer_base_port: int
    replica_base_port: int
    time_scale: float
    profile: str
    traffic: bool
    traffic_rate: float
    traffic_duration_s: int
    var_dir: Path
    # The ASGI server of the balancers: uvicorn by default (16-34 % less CPU per
    # proxied request than daphne and no stalls at 128 streams, docs/performance.md);
    # the console stays on daphne (Channels WebSockets).
    balancer_server: str = "uvicorn"
    # Processes per balancer address (MERIDIAN_PROCESSES; docs/scale-out.md).
    processes: int = 1


BALANCER_SERVERS = ("uvicorn", "daphne")
# uvicorn's httptools protocol with header/body deadlines and a header size limit.
GUARDED_HTTP = "routing.http_protocol:GuardedHttpToolsProtocol"


def replica_specs(topology: DemoTopology, options: StackOptions) -> list[ChildSpec]:
    """One emulator process per region, each hosting that region's replicas on their ports."""
    specs = []
    for region in DEMO_REGIONS:
        args = [
            "-m",
            "sim.serve",
            "--host",
            topology.host,
            "--model",
            DEMO_MODEL,
            "--profile",
            options.profile,
            "--time-scale",
            str(options.time_scale),
        ]
        for replica in topology.replicas_in(region.name):
            args += ["--replica", f"{replica.name}={replica.port}"]
        specs.append(ChildSpec(f"replicas-{region.name}", python_argv(*args)))
    return specs


def balancer_argv(server: str, host: str, port: int) -> tuple[str, ...]:
    """The command serving ``meridian.asgi:application`` as a balancer on ``host:port``."""
    if server == "uvicorn":
        return python_argv(
            "-m", "uvicorn", "--host", host, "--port", str(port), "--lifespan", "on",
            "--http", GUARDED_HTTP, "--no-access-log", "meridian.asgi:application",
        )  # fmt: skip
    if server == "daphne":
        # -v 0: no access-log line per proxied request.
        return (str(BIN_DIR / "daphne"), "-v", "0", "-b", host, "-p", str(port),
                "meridian.asgi:application")  # fmt: skip
    raise ValueError(f"unknown balancer server {server!r}; choose {', '.join(BALANCER_SERVERS)}")


def shared_port_argv(host: str, port: int) -> tuple[str, ...]:
    """One of N uvicorn processes serving one balancer on ``host:port`` (``SO_REUSEPORT``)."""
    return python_argv("-m", "ops.stack.serve", "--host", host, "--port", str(port),
                       "--http", GUARDED_HTTP)  # fmt: skip


def balancer_specs(
    topology: DemoTopology, server: str = "uvicorn", processes: int = 1
) -> list[ChildSpec]:
    """``processes`` children per balancer, all on its one port when more than one
    (docs/scale-out.md); the first keeps the balancer's name, the others get ``#2``..."""
    if processes < 1:
        raise ValueError(f"processes per balancer must be at least 1, not {processes}")
    if processes > 1 and server != "uvicorn":
        raise ValueError(f"{processes} processes per balancer need uvicorn (SO_REUSEPORT)")
    return [
        ChildSpec(
            balancer.name if index == 1 else f"{balancer.name}#{index}",
            balancer_argv(server, topology.host, balancer.port)
            if processes == 1
            else shared_port_argv(topology.host, balancer.port),
            env={"MERIDIAN_BALANCER": balancer.name, "MERIDIAN_DEMO": "true"},
        )
        for balancer in topology.balancers
        for index in range(1, processes + 1)
    ]


def console_spec(options: StackOptions) -> ChildSpec:
    return ChildSpec(
        "console",
        (
            str(BIN_DIR / "daphne"),
            "-b",
            options.host,
            "-p",
            str(options.console_port),
            "meridian.asgi:application",
        ),
    )


def worker_spec(options: StackOptions) -> ChildSpec:
    # One worker with embedded beat keeps the demo to a single control-plane process.
    return ChildSpec(
        "celery",
        (
            str(BIN_DIR / "celery"),
            "-A",
            "meridian",
            "worker",
            "--beat",
            "--concurrency",
            "2",
            "--loglevel",
            "INFO",
            "--schedule",
            str(options.var_dir / "celerybeat-schedule"),
        ),
    )


# Requests per second of synthetic programs per region: the small region is kept busy
# on purpose so that it forwards, as in SkyLB's unbalanced set-up.
TRAFFIC_SHARE = {"us-east": 1.0, "eu-west": 0.6, "ap-southeast": 0.8}


def traffic_specs(topology: DemoTopology, options: StackOptions, api_key: str) -> list[ChildSpec]:
    if not options.traffic:
        return []
    return [
        ChildSpec(
            f"traffic-{balancer.region}",
            python_argv(
                "manage.py",
                "replay",
                "--workload",
                "conversations",
                "--region",
                balancer.region,
                "--rate",
                f"{options.traffic_rate * TRAFFIC_SHARE.get(balancer.region, 1.0):.3f}",
                "--duration",
                str(options.traffic_duration_s),
                "--seed",
                str(index),
            ),
            env={"MERIDIAN_API_KEY": api_key},
            essential=False,
        )
        for index, balancer in enumerate(topology.balancers, start=1)
    ]
