"""Fault drills and process life: reject, hang, slow, busy, die; SIGTERM; idle CPU."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ops import http_probe
from tests.support.engine import fresh_prompt
from tests.support.processes import ProcessGroup
from tests.support.sim_serve import ServedReplicas, start_replicas

pytestmark = pytest.mark.integration

MODEL = "meridian-demo"


def set_fault(url: str, mode: str, **extra: float) -> dict[str, object]:
    response = http_probe.post(f"{url}/fault", json={"mode": mode, **extra}, timeout=5)
    assert response.status_code == 200
    return response.json()  # type: ignore[no-any-return]


@pytest.fixture
def faulty_b(served: ServedReplicas) -> Iterator[str]:
    """Replica b's URL; whatever fault a test sets there is cleared afterwards."""
    yield served.urls["b"]
    set_fault(served.urls["b"], "none")


def complete(url: str, **body: object) -> httpx.Response:
    payload = {"model": MODEL, "prompt": "ping", "max_tokens": 2, **body}
    return http_probe.post(f"{url}/v1/completions", json=payload, timeout=10)


def test_reject_answers_503_to_everything_until_cleared(faulty_b: str) -> None:
    assert set_fault(faulty_b, "reject")["mode"] == "reject"
    response = complete(faulty_b)
    assert response.status_code == 503 and "error" in response.json()
    assert http_probe.get(f"{faulty_b}/health").status_code == 503
    set_fault(faulty_b, "none")
    assert complete(faulty_b).status_code == 200


def test_hang_accepts_but_never_answers_until_cleared(faulty_b: str) -> None:
    set_fault(faulty_b, "hang")
    with pytest.raises(httpx.ReadTimeout):
        http_probe.get(f"{faulty_b}/health", timeout=httpx.Timeout(5.0, read=0.3))
    with pytest.raises(httpx.ReadTimeout):
        http_probe.post(
            f"{faulty_b}/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 1},
            timeout=httpx.Timeout(5.0, read=0.3),
        )
    assert set_fault(faulty_b, "none")["mode"] == "none"
    assert http_probe.get(f"{faulty_b}/health").status_code == 200


def test_busy_makes_the_status_pages_late_while_generation_goes_on(faulty_b: str) -> None:
    assert set_fault(faulty_b, "busy", factor=0.6)["factor"] == 0.6
    for page in ("/health", "/metrics", "/v1/models"):
        with pytest.raises(httpx.ReadTimeout):  # a probe's short timeout misses it
            http_probe.get(f"{faulty_b}{page}", timeout=httpx.Timeout(5.0, read=0.2))
        assert http_probe.get(f"{faulty_b}{page}", timeout=5).status_code == 200  # just late
    set_fault(faulty_b, "busy", factor=30.0)
    assert complete(faulty_b).status_code == 200  # within its 10 s: not held behind the lag
    assert set_fault(faulty_b, "none")["mode"] == "none"


def test_slow_multiplies_modeled_step_times(served: ServedReplicas, faulty_b: str) -> None:
    def ttft_of_a_lone_prefill() -> float:
        before = served.metric("vllm:time_to_first_token_seconds_sum", "b")
        response = complete(faulty_b, prompt=fresh_prompt(512), max_tokens=1)
        assert response.status_code == 200
        return served.metric("vllm:time_to_first_token_seconds_sum", "b") - before

    normal = ttft_of_a_lone_prefill()
    assert set_fault(faulty_b, "slow", factor=4.0)["factor"] == 4.0
    slowed = ttft_of_a_lone_prefill()
    # A lone 512-token prefill is one modeled step (~0.3 s on the L4 profile).
    assert normal == pytest.approx(0.30, abs=0.01)
    assert slowed == pytest.approx(4 * normal, rel=1e-6)


def test_bad_fault_requests_are_refused(served: ServedReplicas) -> None:
    url = served.urls["a"]
    assert http_probe.post(f"{url}/fault", json={"mode": "explode"}).status_code == 400
    assert http_probe.post(f"{url}/fault", json={"mode": "slow", "factor": -1}).status_code == 400
    assert http_probe.get(f"{url}/fault").json()["mode"] == "none"


def test_die_takes_one_replica_away_and_leaves_its_neighbour(processes: ProcessGroup) -> None:
    served = start_replicas(processes, ["a", "b"], "--fault", "b=reject")
    a, b = served.urls["a"], served.urls["b"]
    assert complete(b).status_code == 503  # fault set from the command line
    set_fault(b, "none")

    body = {"model": MODEL, "prompt": "x", "max_tokens": 5000, "ignore_eos": True, "stream": True}
    with (
        pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
        httpx.stream("POST", f"{a}/v1/completions", json=body, timeout=10) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        http_probe.post(f"{a}/fault", json={"mode": "die"}, timeout=5)
        for _ in lines:  # the open stream is reset
            pass
    with pytest.raises(httpx.ConnectError):
        http_probe.get(f"{a}/health", timeout=2)
    assert http_probe.get(f"{b}/health").status_code == 200
    assert complete(b).status_code == 200
    assert served.process.poll() is None


def test_die_on_a_lone_replica_ends_its_process(processes: ProcessGroup) -> None:
    served = start_replicas(processes, ["solo"])
    set_fault(served.urls["solo"], "die")
    assert served.process.wait(timeout=10) == 137


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_replicas_use_no_cpu_and_sigterm_stops_cleanly(processes: ProcessGroup) -> None:
    served = start_replicas(processes, ["r1", "r2", "r3"])
    complete(served.urls["r1"])  # the engine loop has run and gone back to sleep
    process = served.process
    before = cpu_seconds(process.pid)
    time.sleep(2.0)
    assert cpu_seconds(process.pid) - before < 0.2
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=10) == 0


def test_chat_stream_sends_nothing_before_the_first_token(faulty_b: str) -> None:
    """As vLLM: the role chunk rides on the first engine output, so a proxy's first
    body byte is the first token (TTFT) and a failure before it is still retryable."""
    set_fault(faulty_b, "slow", factor=100_000.0)  # prefill now takes hours of wall time
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    timeout = httpx.Timeout(10.0, read=0.5)
    url = f"{faulty_b}/v1/chat/completions"
    with (
        httpx.Client(timeout=timeout) as client,
        client.stream("POST", url, json=body) as response,
    ):
        assert response.status_code == 200  # headers come at once
        with pytest.raises(httpx.ReadTimeout):
            next(response.iter_raw())
