"""``bench routing --against-sglang PATH``: CPU per request, Meridian beside sglang-router.

Both routers are started in front of the same zero-compute emulated replica
(``ops.bench.fixture``) and sent the same chat request, a ~4k-token prompt,
``requests`` times one after another.  A router's cost is its process's CPU time
(user + system, ``psutil``) over those requests, less what it burns idle over the
same wall time (health checks, probes), divided by the number of requests.

* sglang-router (``PATH``: its virtual environment or its ``sglang-router``
  executable, installed apart from Meridian's: it is never a dependency) runs
  ``launch --policy cache_aware``;
* Meridian's balancer runs under uvicorn with the ``cache_map`` policy and, when
  ``model_dir`` is given, that model tokenizer configured for the model.

The same prompt every time is what the comparison was first measured with; it
flatters any cache, so ``ops.bench.prompt_cost`` measures fresh prompts too.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from ops.bench.fixture import MODEL, BenchFixture
from ops.bench.peers import PEERS, Installed, running_peers
from ops.stack.readiness import StartupError

IDLE_WINDOW_S = 2.0
SGLANG = next(spec for spec in PEERS if spec.name == "sglang-router")


@dataclass(frozen=True, slots=True)
class RouterCost:
    router: str
    requests: int
    cpu_ms_per_request: float  # idle CPU over the same wall time subtracted
    raw_cpu_ms_per_request: float


def sglang_executable(path: str) -> Path:
    given = Path(path)
    candidate = given / "bin" / "sglang-router" if given.is_dir() else given
    if not candidate.is_file():
        raise StartupError(f"--against-sglang {path}: no sglang-router executable there")
    return candidate


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def measure_router(
    label: str, pid: int, url: str, body: dict[str, object], headers: dict[str, str], n: int
) -> RouterCost:
    with httpx.Client(base_url=url, headers=headers, timeout=60, trust_env=False) as client:
        for _ in range(3):  # warm up connections, caches, lazy initialisation
            client.post("/v1/chat/completions", json=body).raise_for_status()
        idle_start = cpu_seconds(pid)
        time.sleep(IDLE_WINDOW_S)
        idle_rate = (cpu_seconds(pid) - idle_start) / IDLE_WINDOW_S
        start_cpu, start_wall = cpu_seconds(pid), time.monotonic()
        for _ in range(n):
            client.post("/v1/chat/completions", json=body).raise_for_status()
        used = cpu_seconds(pid) - start_cpu
        wall = time.monotonic() - start_wall
    corrected = max(0.0, used - idle_rate * wall)
    return RouterCost(label, n, corrected * 1000 / n, used * 1000 / n)


@contextmanager
def sglang_router(executable: Path, backend: str) -> Iterator[tuple[int, str]]:
    """sglang-router ``cache_aware`` in front of ``backend``, started as ``bench proxy --peers``
    starts it (``ops.bench.peers``)."""
    with tempfile.TemporaryDirectory(prefix="meridian-sglang-") as logs:
        installed = Installed(executables={SGLANG.name: executable})
        with running_peers(installed, [backend], Path(logs)) as peers:
            yield peers[0].process.pid, peers[0].url


def compare(sglang: str, body_text: str, requests: int, model_dir: Path | None) -> list[RouterCost]:
    extra_env = {"MERIDIAN_MODEL_TOKENIZERS": f"{MODEL}={model_dir}"} if model_dir else {}
    fixture = BenchFixture.start(["uvicorn"], replicas=1, policy="cache_map", extra_env=extra_env)
    try:
        body: dict[str, object] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": body_text}],
            "max_tokens": 1,
        }
        meridian = measure_router(
            "meridian (uvicorn, cache_map" + (", model tokenizer)" if model_dir else ")"),
            fixture.pid_of("uvicorn"),
            fixture.balancers["uvicorn"],
            body,
            {"Authorization": f"Bearer {fixture.api_key}"},
            requests,
        )
        with sglang_router(sglang_executable(sglang), fixture.backends[0]) as (pid, url):
            other = measure_router("sglang-router (cache_aware)", pid, url, body, {}, requests)
    finally:
        fixture.stop()
    return [meridian, other]


def cpu_count_note() -> str:
    return f"{os.cpu_count()} CPUs; idle CPU over {IDLE_WINDOW_S:.0f}s subtracted"
