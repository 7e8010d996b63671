"""``manage.py bench proxy``: what the balancer costs, against calling the backends directly.

By default the command brings up its own loopback stack (``ops.bench.fixture``:
four zero-compute emulated replicas, a throwaway database, the balancer under
daphne, uvicorn or both) and, for each mode (streaming, non-streaming) and each
concurrency, runs the same requests against (a) the backends directly,
round-robin, and (b) each balancer.  Phases alternate (direct first in odd
rounds, last in even ones) so that machine noise hits both sides.  With
``--backend URL`` (repeatable) plus ``--balancer URL --api-key KEY`` it
measures an existing deployment instead and starts nothing.

The output is one table of ratios and differences (``ops.bench.report``);
nothing here asserts a time.  Every process the command started is stopped
when it ends, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil
from django.conf import settings

from ops.bench.bare import running_bare
from ops.bench.driver import LoadGenerator, UsageMonitor, py_spy_recording
from ops.bench.fixture import MODEL, SERVERS, VARIANTS, BenchFixture
from ops.bench.loadgen import Phase
from ops.bench.peers import Installed, install_all, running_peers
from ops.bench.report import DIRECT, Pooled, Row, compare, format_table, write_json

MODES = ("stream", "nonstream")
CHAT_PATH = "/v1/chat/completions"
DISTINCT_PROMPTS = 64  # distinct prefixes, so a prefix-aware policy spreads the load
_WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
    "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
)  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--concurrency",
        type=_int_list,
        default=[1, 32, 128],
        help="comma-separated concurrencies (default 1,32,128)",
    )
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests per phase (default: max(48, 6 x concurrency))",
    )
    parser.add_argument(
        "--duration", type=float, default=0.0, help="seconds per phase instead of a request count"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat every phase, alternating direct/balancer order",
    )
    parser.add_argument("--prompt-tokens", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--server",
        type=_server_list,
        default=["uvicorn"],
        help=f"ASGI server(s) for the balancers this command starts, comma-separated from "
        f"{', '.join((*SERVERS, *VARIANTS))}, or 'both' (daphne and uvicorn); default uvicorn, "
        "the server the balancers run under (docs/performance.md)",
    )
    parser.add_argument(
        "--balancer-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the balancer processes only (repeatable)",
    )
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--policy", default="", help="routing policy (default: skylb if known)")
    parser.add_argument(
        "--pushing",
        default="sp-o",
        help="the service's selective-pushing mode; the default sp-o, with the per-replica cap "
        "raised, never holds a request back, so the proxy itself is measured ('' leaves it unset)",
    )
    parser.add_argument(
        "--base-tree",
        type=Path,
        metavar="DIR",
        help="also run each balancer from this source tree (another checkout), as <server>@base",
    )
    parser.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="URL",
        help="an existing backend to call directly (repeatable)",
    )
    parser.add_argument("--balancer", metavar="URL", help="an existing balancer in front of them")
    parser.add_argument("--api-key", default="", help="the balancer's API key (with --balancer)")
    parser.add_argument("--balancer-pid", type=int, help="its process id, for CPU and RSS")
    parser.add_argument("--model", default="", help=f"model name (default {MODEL})")
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="DIR",
        help="record each balancer phase with py-spy (collapsed stacks) here",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also save the rows as JSON")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also run vllm-router and sglang-router (installed on demand into their own "
        "environments in the user's cache directory; skipped with a note when unavailable)",
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="also run the bare proxy: the balancer's server and upstream pool relaying "
        "round-robin with nothing of Meridian between them (ops/bench/bare.py), the floor "
        "under a balancer's CPU per request",
    )
    parser.add_argument(
        "--idle-window",
        type=float,
        default=5.0,
        help="seconds over which each router's idle CPU is measured (default 5)",
    )
    parser.add_argument(
        "--idle-settle",
        type=float,
        default=10.0,
        help="seconds of quiet after the load before the idle window opens (default 10: "
        "Meridian's probe rounds space out over a few quiet rounds)",
    )


@dataclass(frozen=True, slots=True)
class Targets:
    """Where phases go: the direct backends and each balancer (name → URL, pid)."""

    backends: list[str]
    balancers: dict[str, str]
    pids: dict[str, int | None]
    api_key: str
    model: str
    policy: str
    notes: tuple[str, ...] = ()


def run(options: Any, stdout: TextIO) -> list[Row]:
    """Run the benchmark described by ``options``; prints and returns the rows."""
    opts = vars(options) if not isinstance(options, dict) else options
    _check_options(opts)
    with _stop_on_sigterm(), _targets(opts) as targets:
        stdout.write(_banner(targets))
        stdout.flush()
        with LoadGenerator(Path(settings.BASE_DIR)) as generator:
            rows = run_matrix(opts, targets, generator, stdout)
            idle = idle_cpu(
                targets, float(opts.get("idle_window", 5.0)), float(opts.get("idle_settle", 10.0))
            )
    stdout.write(format_idle(idle) + _load_line())
    stdout.write(format_table(rows))
    if opts.get("json"):
        meta = {k: v for k, v in opts.items() if k in _META_KEYS}
        extra = {"policy": targets.policy, "idle_cpu_cores": idle, "notes": list(targets.notes),
                 "load_average": list(os.getloadavg())}  # fmt: skip
        write_json(Path(opts["json"]), rows, {**meta, **extra})
    return rows


def idle_cpu(targets: Targets, window_s: float, settle_s: float = 10.0) -> dict[str, float]:
    """Each router's CPU seconds per wall second while nothing is sent (probes, timers).

    All routers are watched over the same window, ``settle_s`` after the load (the
    last phase's connections wind down, and Meridian's probe schedule reaches its
    idle gap), with every backend healthy.
    """
    processes = {name: psutil.Process(pid) for name, pid in targets.pids.items() if pid}
    if not processes or window_s <= 0:
        return {}
    time.sleep(max(0.0, settle_s))
    start = {name: _cpu_s(process) for name, process in processes.items()}
    began = time.monotonic()
    time.sleep(window_s)
    wall = time.monotonic() - began
    return {name: (_cpu_s(process) - start[name]) / wall for name, process in processes.items()}


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def format_idle(idle: dict[str, float]) -> str:
    if not idle:
        return ""
    cells = ", ".join(f"{name} {cores:.4f}" for name, cores in idle.items())
    return f"idle CPU (cores, nothing sent): {cells}\n"


def _load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs\n"


_META_KEYS = ("concurrency", "mode", "requests", "duration", "rounds", "prompt_tokens",
              "max_tokens", "server", "replicas", "pushing", "peers", "bare", "idle_window",
              "idle_settle")  # fmt: skip


def run_matrix(
    opts: dict[str, Any], targets: Targets, generator: LoadGenerator, stdout: TextIO
) -> list[Row]:
    """Every (mode, concurrency) against direct and each balancer; one row per balancer."""
    modes = MODES if opts.get("mode", "both") == "both" else (opts["mode"],)
    _warm_up(opts, targets, generator)
    rows = []
    for mode in modes:
        for concurrency in opts["concurrency"]:
            pooled = _measure(opts, targets, generator, mode, concurrency)
            for server in targets.balancers:
                rows.append(compare(mode, concurrency, server, pooled[DIRECT], pooled[server]))
            stdout.write(f"  done: {mode} at concurrency {concurrency}\n")
            stdout.flush()
    return rows


def _measure(
    opts: dict[str, Any], targets: Targets, generator: LoadGenerator, mode: str, concurrency: int
) -> dict[str, Pooled]:
    order = [DIRECT, *targets.balancers]
    pooled = {name: Pooled() for name in order}
    for round_index in range(max(1, opts.get("rounds", 1))):
        for name in order if round_index % 2 == 0 else order[::-1]:
            phase = _phase(opts, targets, name, mode, concurrency)
            pid = targets.pids.get(name)
            monitor = UsageMonitor(pid) if pid else None
            with _profiled(opts, pid, f"{name}-{mode}-{concurrency}-r{round_index}"):
                if monitor:
                    monitor.start()
                result = generator.run(phase)
                usage = monitor.stop() if monitor else None
            pooled[name].add(result, usage)
    return pooled


def _profiled(opts: dict[str, Any], pid: int | None, label: str) -> Any:
    """py-spy on the balancer during its phase when ``--py-spy DIR`` asks for it."""
    directory = opts.get("py_spy")
    if not directory or pid is None:
        return contextlib.nullcontext()
    Path(directory).mkdir(parents=True, exist_ok=True)
    return py_spy_recording(pid, Path(directory) / f"{label}.txt")


def _warm_up(opts: dict[str, Any], targets: Targets, generator: LoadGenerator) -> None:
    """A few unrecorded requests per target: connections, pools and imports warmed."""
    for name in [DIRECT, *targets.balancers]:
        for mode in MODES:
            generator.run(_phase({**opts, "requests": 16, "duration": 0}, targets, name, mode, 4))


def _phase(opts: dict[str, Any], targets: Targets, name: str, mode: str, concurrency: int) -> Phase:
    stream = mode == "stream"
    direct = name == DIRECT
    requests = opts.get("requests") or max(48, 6 * concurrency)
    return Phase(
        label=f"{name}/{mode}/{concurrency}",
        targets=targets.backends if direct else [targets.balancers[name]],
        path=CHAT_PATH,
        bodies=request_bodies(targets.model, opts["prompt_tokens"], opts["max_tokens"], stream),
        concurrency=concurrency,
        requests=requests,
        duration_s=opts.get("duration") or 0.0,
        stream=stream,
        headers={} if direct else {"Authorization": f"Bearer {targets.api_key}"},
    )


def request_bodies(model: str, prompt_tokens: int, max_tokens: int, stream: bool) -> list[str]:
    """The same ``DISTINCT_PROMPTS`` chat requests for every target (seeded, repeatable).

    ``ignore_eos`` (a vLLM extension the emulated replica honours) makes every
    reply exactly ``max_tokens`` long, so tokens per second is comparable.
    """
    rng = random.Random(7)
    bodies = []
    for index in range(DISTINCT_PROMPTS):
        words = [f"request{index}"] + [rng.choice(_WORDS) for _ in range(prompt_tokens - 1)]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": " ".join(words)}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": stream,
        }
        bodies.append(json.dumps(body))
    return bodies


# -- targets -----------------------------------------------------------------------------


@contextlib.contextmanager
def _targets(opts: dict[str, Any]) -> Iterator[Targets]:
    model = opts.get("model") or MODEL
    if opts.get("backend"):
        backends = list(opts["backend"])
        balancers = {"balancer": opts["balancer"]}
        pids: dict[str, int | None] = {"balancer": opts.get("balancer_pid")}
        with contextlib.ExitStack() as running:
            if opts.get("bare"):
                # The bare proxy needs only the backends: beside a deployment too.
                logs = Path(running.enter_context(tempfile.TemporaryDirectory()))
                bare = running.enter_context(running_bare(backends, logs))
                balancers[bare.name], pids[bare.name] = bare.url, bare.process.pid
            yield Targets(
                backends=backends,
                balancers=balancers,
                pids=pids,
                api_key=opts.get("api_key") or "",
                model=model,
                policy="(existing deployment)",
            )
        return
    servers = _server_list(opts.get("server") or "uvicorn")
    extra_env = dict(item.split("=", 1) for item in opts.get("balancer_env") or [])
    installed = install_all() if opts.get("peers") else Installed()
    fixture = BenchFixture.start(
        servers,
        opts.get("replicas", 4),
        opts.get("policy", ""),
        opts.get("pushing", "sp-o"),
        opts.get("base_tree"),
        extra_env,
    )
    try:
        logs = Path(fixture.workdir.name) / "logs"
        with contextlib.ExitStack() as running:
            peers = running.enter_context(running_peers(installed, fixture.backends, logs))
            if opts.get("bare"):
                peers.append(running.enter_context(running_bare(fixture.backends, logs)))
            balancers = dict(fixture.balancers)
            pids = {s: fixture.pid_of(s) for s in fixture.balancers}
            for peer in peers:
                balancers[peer.name], pids[peer.name] = peer.url, peer.process.pid
            yield Targets(fixture.backends, balancers, pids, fixture.api_key, model,
                          fixture.policy, tuple(installed.notes))  # fmt: skip
    finally:
        fixture.stop()


def _check_options(opts: dict[str, Any]) -> None:
    if opts.get("backend") and not opts.get("balancer"):
        raise ValueError("--backend needs --balancer URL (and --api-key) to compare with")
    if opts.get("balancer") and not opts.get("backend"):
        raise ValueError("--balancer needs the backends behind it: --backend URL (repeatable)")
    if any(c < 1 for c in opts["concurrency"]) or opts.get("rounds", 1) < 1:
        raise ValueError("--concurrency values and --rounds must be at least 1")
    for item in opts.get("balancer_env") or []:
        if "=" not in item or not item.split("=", 1)[0]:
            raise ValueError(f"--balancer-env expects NAME=VALUE, got {item!r}")
    if opts["prompt_tokens"] < 1 or opts["max_tokens"] < 1:
        raise ValueError("--prompt-tokens and --max-tokens must be at least 1")


def _banner(targets: Targets) -> str:
    balancers = ", ".join(f"{name} {url}" for name, url in targets.balancers.items())
    notes = "".join(f"  note: {note}\n" for note in targets.notes)
    return (f"bench proxy: {len(targets.backends)} backend(s) direct vs {balancers}; "
            f"model {targets.model}, policy {targets.policy}\n{notes}{_load_line()}")  # fmt: skip


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the ``finally`` blocks stop every child."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _server_list(value: str | list[str]) -> list[str]:
    """``--server``: 'both', or names from SERVERS and VARIANTS, comma-separated."""
    if isinstance(value, list):
        return value
    if value == "both":
        return list(SERVERS)
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in (*SERVERS, *VARIANTS)]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown server(s) {', '.join(unknown) or value!r}; "
            f"choose from {', '.join((*SERVERS, *VARIANTS))} or 'both'"
        )
    return names


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,32,128, got {text!r}") from None
