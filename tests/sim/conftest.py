"""Fixtures for the emulated replica: engines built in-process and served replicas."""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from routing.core.tokenizer import WordTokenizer
from sim.engine import Engine, EngineConfig, EngineRequest, StepResult, Vocabulary
from tests.support.processes import ProcessGroup, free_port, free_port_run, wait_http

TIME_SCALE = "0.02"
_token_counter = itertools.count(10_000)


@pytest.fixture(scope="session")
def vocab() -> Vocabulary:
    return Vocabulary(WordTokenizer())


@pytest.fixture
def make_engine(vocab: Vocabulary) -> Callable[..., Engine]:
    """``make_engine(num_blocks=8, ...)``: an L4-profile engine with overridden knobs."""

    def build(**overrides: object) -> Engine:
        return Engine(replace(EngineConfig(), **overrides), vocab)  # type: ignore[arg-type]

    return build


def fresh_prompt(length: int) -> list[int]:
    """Token ids no other prompt in the session shares (so nothing is cached by accident)."""
    return [next(_token_counter) for _ in range(length)]


def request(
    request_id: str, prompt: list[int], max_tokens: int = 16, **kw: object
) -> EngineRequest:
    return EngineRequest(request_id, list(prompt), max_tokens, **kw)  # type: ignore[arg-type]


def run_to_completion(engine: Engine, max_steps: int = 10_000) -> list[StepResult]:
    results = []
    while engine.has_work():
        results.append(engine.step())
        assert len(results) < max_steps, "engine made no progress"
    return results


@dataclass
class ServedReplicas:
    """A ``sim.serve`` child process and the base URL of each of its replicas."""

    process: subprocess.Popen[bytes]
    urls: dict[str, str]
    kv_port_base: int

    def metric(self, name: str, replica: str, **labels: str) -> float:
        return read_metric(self.urls[replica], name, **labels)


def read_metric(url: str, name: str, **labels: str) -> float:
    """One sample from a replica's /metrics; the labels given must all match."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics")


def start_replicas(
    group: ProcessGroup, names: list[str], *extra: str, kv_port_base: int | None = None
) -> ServedReplicas:
    ports = {name: free_port() for name in names}
    args = ["-m", "sim.serve", "--time-scale", TIME_SCALE, "--model", "meridian-demo"]
    for name, port in ports.items():
        args += ["--replica", f"{name}={port}"]
    if kv_port_base is not None:
        args += ["--kv-events-port-base", str(kv_port_base)]
    process = group.python("sim-" + "-".join(names), *args, *extra)
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    for url in urls.values():
        wait_http(f"{url}/v1/models", process=process)
    return ServedReplicas(process, urls, kv_port_base or 0)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedReplicas]:
    """Two replicas, ``a`` and ``b``, in one child process shared by a test module.

    Tests that set a fault on it clear the fault before they end.
    """
    group = ProcessGroup(Path(tmp_path_factory.mktemp("sim-logs")))
    try:
        yield start_replicas(
            group, ["a", "b"], "--lora", "sql-expert", kv_port_base=free_port_run(2)
        )
    finally:
        group.stop_all()
