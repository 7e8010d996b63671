"""`manage.py run_demo`: bring up the whole three-region demo and keep it running.

Ensures Redis (embedded if none answers), migrates, seeds the demo topology,
creates credentials, starts emulated replicas, one balancer (uvicorn) per region,
the console, a Celery worker with beat and synthetic traffic, prints where
everything is, and stops every child on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ops.demo import DEMO_MODEL, DEMO_POLICY, DemoTopology, plan_demo, seed_demo
from ops.embedded_redis import EmbeddedRedis, RedisUnavailableError, ensure_redis
from ops.stack.banner import banner
from ops.stack.credentials import ensure_credentials
from ops.stack.plan import (
    BALANCER_SERVERS,
    StackOptions,
    balancer_specs,
    console_spec,
    replica_specs,
    traffic_specs,
    worker_spec,
)
from ops.stack.readiness import StartupError, port_is_free, wait_until_answering
from ops.stack.supervisor import RestartPolicy, Supervisor, tail
from workers.policy_config import PolicyConfigError, set_policy
from workers.probes import probe_replicas


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    # Only the first signal stops the demo.  Ctrl-C reaches make and this process alike,
    # and make passes its own on: a second signal raised inside ``stop_all`` would abandon
    # the children it had not yet waited for, leaving them running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise _Stop


class Command(BaseCommand):
    help = "Run the three-region demo (replicas, balancers, console, Celery, traffic) until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-traffic", action="store_true", help="start no synthetic traffic")
        parser.add_argument("--startup-timeout", type=float, default=90.0)
        parser.add_argument(
            "--policy",
            help=f"routing policy of the demo service (kept from the last run, else {DEMO_POLICY})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        opts = self.stack_options(traffic=not options["no_traffic"])
        topology = plan_demo(opts.host, opts.balancer_base_port, opts.replica_base_port)
        self.check_ports(opts, topology)
        redis_handle = self.start_redis(opts.var_dir)
        supervisor = Supervisor(
            opts.var_dir / "logs",
            Path(settings.BASE_DIR),
            restart_policy=RestartPolicy(
                attempts=settings.MERIDIAN_RESTART_ATTEMPTS,
                backoff_s=settings.MERIDIAN_RESTART_BACKOFF_S,
            ),
        )
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGINT, _raise_stop)
        try:
            self.prepare_database(topology, options["policy"])
            creds = ensure_credentials(opts.var_dir)
            self.start_stack(supervisor, topology, opts, float(options["startup_timeout"]))
            for spec in traffic_specs(topology, opts, creds.api_key):
                supervisor.start(spec)
            console_url = f"http://{opts.host}:{opts.console_port}"
            self.stdout.write(banner(topology, console_url, creds, str(supervisor.log_dir)))
            self.watch(supervisor)
        except _Stop:
            self.stdout.write("\nStopping…")
        except StartupError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            supervisor.stop_all()
            redis_handle.stop()
        self.stdout.write("Every process stopped.")

    def stack_options(self, *, traffic: bool) -> StackOptions:
        s = settings
        return StackOptions(
            host=s.MERIDIAN_HOST,
            console_port=s.MERIDIAN_CONSOLE_PORT,
            balancer_base_port=s.MERIDIAN_BALANCER_BASE_PORT,
            replica_base_port=s.MERIDIAN_REPLICA_BASE_PORT,
            time_scale=s.MERIDIAN_CLOUD_SIM_TIME_SCALE,
            profile=s.MERIDIAN_SIM_PROFILE,
            traffic=traffic and s.MERIDIAN_DEMO_TRAFFIC,
            traffic_rate=s.MERIDIAN_DEMO_TRAFFIC_RATE,
            traffic_duration_s=s.MERIDIAN_DEMO_TRAFFIC_S,
            var_dir=Path(settings.VAR_DIR),
            balancer_server=(server := self.balancer_server()),
            # SO_REUSEPORT needs uvicorn; daphne serves one process per balancer.
            processes=s.MERIDIAN_PROCESSES if server == "uvicorn" else 1,
        )

    def balancer_server(self) -> str:
        server = settings.MERIDIAN_BALANCER_SERVER
        if server not in BALANCER_SERVERS:
            raise CommandError(
                f"MERIDIAN_BALANCER_SERVER={server!r}: choose {' or '.join(BALANCER_SERVERS)}"
            )
        return server

    def check_ports(self, opts: StackOptions, topology: DemoTopology) -> None:
        wanted = [("MERIDIAN_CONSOLE_PORT", opts.console_port)]
        wanted += [("MERIDIAN_BALANCER_BASE_PORT", b.port) for b in topology.balancers]
        wanted += [("MERIDIAN_REPLICA_BASE_PORT", r.port) for r in topology.replicas]
        busy = [(var, port) for var, port in wanted if not port_is_free(opts.host, port)]
        if busy:
            listed = ", ".join(f"{port} (moved by {var})" for var, port in busy)
            raise CommandError(f"ports already in use on {opts.host}: {listed}")

    def start_redis(self, var_dir: Path) -> EmbeddedRedis:
        try:
            handle = ensure_redis(settings.REDIS_URL, data_dir=var_dir / "redis")
        except RedisUnavailableError as exc:
            raise CommandError(str(exc)) from exc
        where = "embedded redis-server started" if handle.embedded else "using the running Redis"
        self.stdout.write(f"Redis: {where} at {handle.url}")
        return handle

    def prepare_database(self, topology: DemoTopology, policy: str | None) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        seed_demo(topology)
        if policy:
            try:
                set_policy(DEMO_MODEL, policy, {}, actor="run_demo")
            except PolicyConfigError as exc:
                raise CommandError(str(exc)) from exc

    def start_stack(
        self, supervisor: Supervisor, topology: DemoTopology, opts: StackOptions, timeout: float
    ) -> None:
        replicas = [supervisor.start(s) for s in replica_specs(topology, opts)]
        wait_until_answering(
            [f"http://{opts.host}:{r.port}/health" for r in topology.replicas],
            replicas,
            timeout=timeout,
        )
        # Mark replicas ready now rather than at the worker's first beat.
        probe_replicas(failure_threshold=settings.MERIDIAN_PROBE_FAILURE_THRESHOLD)
        # Balancers, console and Celery come back if they die (replicas do not: drills).
        restartable = [
            *balancer_specs(topology, opts.balancer_server, opts.processes),
            console_spec(opts),
            worker_spec(opts),
        ]
        services = [supervisor.start(dataclasses.replace(s, restart=True)) for s in restartable]
        urls = [f"http://{opts.host}:{b.port}/health" for b in topology.balancers]
        urls.append(f"http://{opts.host}:{opts.console_port}/admin/login/")
        wait_until_answering(urls, services, timeout=timeout)

    def watch(self, supervisor: Supervisor) -> None:
        while True:
            for child in supervisor.exited():
                code = child.process.returncode
                level = self.style.ERROR if child.spec.essential else self.style.WARNING
                self.stdout.write(
                    level(f"{child.spec.name} exited with {code}; log {child.log_path}")
                )
                if child.spec.essential and code != 0:
                    self.stdout.write(tail(child.log_path))
                if supervisor.gave_up(child):
                    self.stdout.write(self.style.ERROR(f"{child.spec.name}: not restarting"))
            for child in supervisor.restart_due():
                self.stdout.write(f"{child.spec.name} restarted (attempt {child.restarts})")
            time.sleep(1.0)
