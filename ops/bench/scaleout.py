"""``manage.py bench scaleout``: N balancer processes behind one address (docs/scale-out.md).

Three tables, each from real processes on loopback (the proxy benchmark's stack,
``ops.bench.fixture``: emulated zero-compute replicas with a real prefix cache, a
throwaway database, the balancer as ``ops.stack.serve`` processes on one
``SO_REUSEPORT`` port):

1. **Hit rate by processes per region**, shared state against per-process state:
   the conversations workload (``sim.workloads.synthetic``) replayed closed-loop
   through the balancer's one address with the official client, whose keep-alive
   connections the kernel spreads over the processes, so the turns of one
   conversation land on different processes.  Hit rate is cached prompt tokens /
   prompt tokens as the replicas report them.  Each row starts from fresh replicas
   (empty caches) and an empty route log, and replays the same programs.  Target:
   shared state at 4 processes keeps >= 95 % of the single process's hit rate.
2. **Redis cost per decision**: one exchange (``routing.shared_state``: a Lua
   script, one round trip) timed in this process against the configured Redis,
   carrying 1, 8 and 32 routes of 128 blocks (a 2k-token prompt), p50 and p99
   per exchange and per decision.  No decision waits on it: it runs in the
   background every ``MERIDIAN_SHARED_SYNC_S``.
4. **Idle CPU** (``--skip idle`` leaves it out): ``--idle-processes`` processes
   with 4 healthy emulated replicas and no traffic, psutil CPU seconds of each over
   ``--idle-seconds``, in one run: shared state off (the probing, heartbeats and
   live feed alone), shared state on with the exchange unpaced
   (``MERIDIAN_SHARED_IDLE_CHECK_S=0``: the full script every sync period), and
   paced (the default).
3. **Throughput at ``--streams`` concurrent streams**, 1 against 2 processes
   with shared state, in the same run: requests per second, errors, TTFT, and
   the balancer processes' CPU ms per request (psutil), from the proxy
   benchmark's separate load-generator process.

Small request counts are fine on a busy machine; the command prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
import redis
from django.conf import settings

from core.metrics import MetricsRegistry
from core.registry import build_policy
from core.router import LocalRouter
from core.shared_state import RouteRecord, SharedConfig
from core.topology import ModelSpec, ReplicaSpec
from ops import http_probe
from ops.bench.driver import LoadGenerator, UsageMonitor
from ops.bench.fixture import BALANCER, MODEL, BenchFixture, _free_port
from ops.bench.loadgen import Phase
from ops.bench.proxy import CHAT_PATH, request_bodies
from ops.bench.routing import format_table, percentile
from ops.drills.redis_outage import every_process_sharing
from ops.replay.runner import ReplayLimits, ReplayRunner
from ops.replay.sender import OpenAISender, make_client
from ops.stack.plan import shared_port_argv
from ops.stack.readiness import StartupError
from ops.stack.supervisor import ChildSpec, Supervisor
from routing.shared_state import SharedStateSync, shared_keys
from sim.workloads import ClosedLoop
from sim.workloads.synthetic import Conversations, ConversationsConfig

HIT_RATE_TARGET = 0.95


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", default="1,2,4", help="processes per region (1 first)")
    parser.add_argument("--programs", type=int, default=48, help="conversations replayed")
    parser.add_argument("--clients", type=int, default=8, help="closed-loop clients")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--policy", default="meridian", help="the service's routing policy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--streams", type=int, default=128, help="throughput concurrency")
    parser.add_argument("--stream-requests", type=int, default=1024)
    parser.add_argument("--exchanges", type=int, default=300, help="timed exchanges per row")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle window per row")
    parser.add_argument("--idle-processes", type=int, default=2)
    parser.add_argument("--skip", default="", help="tables to skip: hit,redis,throughput,idle")


def run(options: dict[str, Any], stdout: TextIO) -> None:
    counts = [int(p) for p in str(options.get("processes") or "1,2,4").split(",") if p.strip()]
    if not counts or counts[0] != 1 or min(counts) < 1:
        raise ValueError("--processes must start with 1 (the baseline), e.g. 1,2,4")
    skip = {s.strip() for s in str(options.get("skip") or "").split(",") if s.strip()}
    if "hit" not in skip:
        stdout.write(hit_rate_table(options, counts))
    if "redis" not in skip:
        stdout.write(redis_cost_table(int(options.get("exchanges") or 300)))
    if "throughput" not in skip:
        stdout.write(throughput_table(options))
    if "idle" not in skip:
        stdout.write(idle_table(options))


# -- the stack: N processes of one balancer on one port -----------------------------------


@dataclass
class Stack:
    fixture: BenchFixture
    url: str
    pids: list[int]


def start_stack(
    options: dict[str, Any], processes: int, shared: bool, extra: dict[str, str] | None = None
) -> Stack:
    """Fresh replicas and database, an empty route log, ``processes`` balancer processes."""
    clear_shared_keys()
    workdir = tempfile.TemporaryDirectory(prefix="meridian-bench-scaleout-")
    supervisor = Supervisor(Path(workdir.name) / "logs", Path(settings.BASE_DIR))
    fixture = BenchFixture(supervisor, workdir)
    try:
        fixture._start_replicas(int(options.get("replicas") or 4))
        env = fixture._seed(["shared"], str(options.get("policy") or ""), "")
        env = {**env, "MERIDIAN_SHARED_STATE": "1" if shared else "0", **(extra or {})}
        port = int(fixture.balancers["shared"].rsplit(":", 1)[1])
        children = [
            fixture.supervisor.start(
                ChildSpec(f"balancer-{i}", shared_port_argv("127.0.0.1", port), env=env)
            )
            for i in range(processes)
        ]
        fixture.balancer_children["shared"] = children[0]
        fixture._wait_routable("shared")
        if shared:
            _wait_sharing(fixture.balancers["shared"], processes)
    except BaseException:
        fixture.stop()
        raise
    return Stack(fixture, fixture.balancers["shared"], [c.process.pid for c in children])


def _wait_sharing(url: str, processes: int, timeout_s: float = 60.0) -> None:
    """Until every process behind ``url`` shares state with all its siblings, asked
    through ``/health`` (these balancers keep their install token to themselves, so
    ``/internal/state`` is not open to the bench).  One process's word is not
    enough: one that has not exchanged since its sibling started counts no sibling."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if every_process_sharing(url, processes, read=_health_view):
            return
        time.sleep(0.2)
    raise StartupError(f"{processes} balancer processes did not all share state in time")


def _health_view(url: str) -> dict[str, Any] | None:
    try:
        view = http_probe.get(f"{url}/health", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return None
    return view if isinstance(view, dict) else None


def clear_shared_keys() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.delete(*shared_keys(BALANCER))
    finally:
        client.close()


# -- table 1: hit rate -----------------------------------------------------------------------


def hit_rate_table(options: dict[str, Any], counts: list[int]) -> str:
    rows: list[list[str]] = []
    baseline: float | None = None
    programs, clients = int(options["programs"]), int(options["clients"])
    for processes in counts:
        for shared in (True, False) if processes > 1 else (True,):
            stack = start_stack(options, processes, shared)
            try:
                snap = asyncio.run(_replay(stack, options))
            finally:
                stack.fixture.stop()
            rate = snap.cached_share
            baseline = rate if processes == 1 else baseline
            share = rate / baseline if baseline else 0.0
            verdict = "-" if processes == 1 or not shared else _verdict(share, processes)
            rows.append([str(processes), "shared" if shared else "per-process",
                         str(snap.ok), str(snap.failed), f"{rate:.3f}", f"{share:.1%}",
                         verdict])  # fmt: skip
    headers = ["processes", "state", "ok", "failed", "hit rate", "of 1 process", ">=95% @4"]
    title = (
        f"hit rate, conversations workload ({programs} programs, {clients} clients, "
        f"policy {options.get('policy')}), through one SO_REUSEPORT address\n"
    )
    return title + format_table(headers, rows) + "\n"


def _verdict(share: float, processes: int) -> str:
    if processes < 4:
        return "-"
    return "ok" if share >= HIT_RATE_TARGET else "MISS"


async def _replay(stack: Stack, options: dict[str, Any]) -> Any:
    config = ConversationsConfig(seed=int(options.get("seed") or 0))
    programs = itertools.islice(Conversations(config).programs(), int(options["programs"]))
    client = make_client(stack.url, stack.fixture.api_key)
    try:
        runner = ReplayRunner(
            programs,
            ClosedLoop(int(options["clients"])),
            OpenAISender(client, MODEL),
            limits=ReplayLimits(duration=600.0),
        )
        return await runner.run()
    finally:
        await client.close()


# -- table 2: Redis cost ----------------------------------------------------------------------


def redis_cost_table(exchanges: int) -> str:
    rows = []
    for batch in (1, 8, 32):
        trips, whole, cpu = asyncio.run(_time_exchanges(batch, exchanges))
        t50, t99 = percentile(trips, 0.5), percentile(trips, 0.99)
        w50, w99 = percentile(whole, 0.5), percentile(whole, 0.99)
        c50, c99 = percentile(cpu, 0.5), percentile(cpu, 0.99)
        rows.append([str(batch), str(len(whole)), f"{t50:.0f}", f"{t99:.0f}", f"{w50:.0f}",
                     f"{w99:.0f}", f"{w50 / batch:.1f}", f"{w99 / batch:.1f}",
                     f"{c50:.0f}", f"{c99:.0f}", f"{c50 / batch:.1f}",
                     f"{c99 / batch:.1f}"])  # fmt: skip
    headers = ["routes/exchange", "exchanges", "round trip p50 us", "p99 us",
               "whole exchange p50 us", "p99 us", "per decision p50 us", "p99 us",
               "CPU/exchange p50 us", "p99 us", "CPU/decision p50 us", "p99 us"]  # fmt: skip
    title = (
        "Redis cost: one exchange (one round trip) per sync period, 128-block routes, the "
        "sibling's as many; 0 round trips inside a decision\n"
    )
    return title + format_table(headers, rows) + "\n"


async def _time_exchanges(
    batch: int, exchanges: int
) -> tuple[list[float], list[float], list[float]]:
    """Microseconds per exchange: the script's round trip, the whole exchange (the
    round trip plus decoding and learning the sibling's ``batch`` routes), both wall
    clock, and this process's CPU time for the whole exchange (``process_time``: what
    a loaded machine's scheduler does not inflate).  Blocks are random 64-bit hashes,
    as ``core.blocks`` makes them."""
    router = LocalRouter(build_policy, max_outstanding=64)
    specs = [ReplicaSpec(f"r{i}", f"http://r{i}", MODEL, "bench", "bench-1", "reserved")
             for i in range(4)]  # fmt: skip
    router.apply(specs, {MODEL: ModelSpec(MODEL, "skylb")})
    balancer = f"bench-cost-{_free_port()}"
    mine = SharedStateSync(
        settings.REDIS_URL, balancer=balancer, router=router, config=SharedConfig(),
        registry=MetricsRegistry(), process="bench-1",
    )  # fmt: skip
    sibling = SharedStateSync(
        settings.REDIS_URL, balancer=balancer, router=_twin(router), config=SharedConfig(),
        registry=MetricsRegistry(), process="bench-2",
    )  # fmt: skip
    trips: list[float] = []
    whole: list[float] = []
    cpu: list[float] = []
    try:
        for n in range(exchanges + 10):
            for k in range(batch):
                rng = random.Random(n * 1000 + k)
                blocks = tuple(rng.getrandbits(64) for _ in range(128))
                sibling.view.record_route(RouteRecord(MODEL, f"r{k % 4}", blocks))
                mine.view.record_route(RouteRecord(MODEL, f"r{k % 4}", blocks[::-1]))
            await sibling.sync()  # the sibling's routes: what this process reads back
            started, cpu0 = time.perf_counter(), time.process_time()
            ok = await mine.sync()
            spent = (time.process_time() - cpu0) * 1e6
            if ok and n >= 10:  # the first ones warm the connection and the script cache
                cpu.append(spent)
                whole.append((time.perf_counter() - started) * 1e6)
                trips.append(mine.last_round_trip_s * 1e6)
    finally:
        client = redis.Redis.from_url(settings.REDIS_URL)
        client.delete(*shared_keys(balancer))
        client.close()
        await mine.close()
        await sibling.close()
    if not whole:
        raise StartupError(f"no exchange with Redis at {settings.REDIS_URL} succeeded")
    return trips, whole, cpu


def _twin(router: LocalRouter) -> LocalRouter:
    twin = LocalRouter(build_policy, max_outstanding=router.max_outstanding)
    specs = [ReplicaSpec(t.target_id, t.url, MODEL, "bench", "bench-1", "reserved")
             for t in router.targets()]  # fmt: skip
    twin.apply(specs, {MODEL: ModelSpec(MODEL, "skylb")})
    return twin


# -- table 3: throughput ------------------------------------------------------------------------


def throughput_table(options: dict[str, Any]) -> str:
    streams, requests = int(options["streams"]), int(options["stream_requests"])
    rows = []
    for processes in (1, 2):
        stack = start_stack(options, processes, shared=True)
        try:
            rows.append(_throughput_row(stack, processes, streams, requests))
        finally:
            stack.fixture.stop()
    headers = ["processes", "requests", "ok", "errors", "req/s", "TTFT p50 ms",
               "balancer CPU ms/req"]  # fmt: skip
    title = f"throughput, {streams} concurrent streams, {requests} requests, shared state\n"
    return title + format_table(headers, rows) + "\n"


def _throughput_row(stack: Stack, processes: int, streams: int, requests: int) -> list[str]:
    bodies = request_bodies(MODEL, 256, 32, stream=True)
    headers = {"Authorization": f"Bearer {stack.fixture.api_key}"}

    def phase(label: str, count: int, concurrency: int) -> Phase:
        return Phase(label, [stack.url], CHAT_PATH, bodies, concurrency, count, 0.0, True,
                     headers)  # fmt: skip

    with LoadGenerator(Path(settings.BASE_DIR)) as generator:
        generator.run(phase("warm-up", 4 * streams, streams))
        monitors = [UsageMonitor(pid) for pid in stack.pids]
        for monitor in monitors:
            monitor.start()
        result = generator.run(phase(f"{processes}p", requests, streams))
        cpu_s = sum(monitor.stop()[0] for monitor in monitors)
    ok, elapsed = int(result["ok"]), float(result["elapsed_s"]) or 1.0
    ttft = sorted(result.get("ttft_s") or [0.0])
    return [str(processes), str(requests), str(ok), str(result["errors"]), f"{ok / elapsed:.0f}",
            f"{percentile(ttft, 0.5) * 1000:.1f}", f"{cpu_s * 1000 / max(ok, 1):.2f}"]  # fmt: skip


# -- table 4: idle CPU ---------------------------------------------------------------------------

IDLE_ROWS: tuple[tuple[str, bool, dict[str, str]], ...] = (
    ("shared state off", False, {}),
    ("shared, unpaced", True, {"MERIDIAN_SHARED_IDLE_CHECK_S": "0"}),
    ("shared, paced", True, {}),
)


def idle_table(options: dict[str, Any]) -> str:
    seconds = float(options.get("idle_seconds") or 60.0)
    processes = int(options.get("idle_processes") or 2)
    if seconds <= 0 or processes < 1:
        raise ValueError("--idle-seconds must be positive and --idle-processes at least 1")
    rows = []
    for label, shared, extra in IDLE_ROWS:
        stack = start_stack(options, processes, shared, extra)
        try:
            time.sleep(3.0)  # warm start, first probes and the first exchanges done
            monitors = [UsageMonitor(pid) for pid in stack.pids]
            for monitor in monitors:
                monitor.start()
            time.sleep(seconds)
            cpu = [monitor.stop()[0] for monitor in monitors]
        finally:
            stack.fixture.stop()
        per = [c / seconds for c in cpu]
        rows.append([label, str(processes), f"{sum(per) / len(per):.4f}", f"{max(per):.4f}",
                     f"{sum(cpu) * 1000 / len(cpu) / seconds:.2f}"])  # fmt: skip
    headers = ["balancer", "processes", "cores per process (mean)", "max", "CPU ms/s"]
    title = (
        f"idle CPU, {int(options.get('replicas') or 4)} healthy emulated replicas, no "
        f"traffic, {seconds:.0f} s per row (psutil)\n"
    )
    return title + format_table(headers, rows) + "\n"
