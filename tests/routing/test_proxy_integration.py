"""One region end to end: the official OpenAI client → a daphne balancer → two
emulated replicas, over real sockets.

This balancer's Redis URL points at a closed port on purpose: heartbeats fail
the whole time, which is the "Redis is down" case, and local serving must not
notice.  The per-replica cap is 1 so two held requests fill the region, and the
service has no queue room (``queue_max_len=0``), so a full region answers 429
at once instead of queueing (test_selective_pushing_integration covers the queue).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from ops import http_probe
from tests.support.balancers import (
    MODEL,
    TopologyFactory,
    client,
    metric_value,
    samples,
    set_fault,
    start_balancer,
    start_replicas,
    state,
)
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

# django_db (not transaction=True): the rows are committed once by the module's
# ``topology`` fixture for the balancer processes to read; a transactional test
# would flush them after its first test.  The marker is what makes pytest-django
# create the test database for this session.
pytestmark = [pytest.mark.integration, pytest.mark.django_db]

LONG_PROMPT = " ".join(
    f"shared context sentence number {i} about regional routing" for i in range(12)
)


@dataclass(frozen=True)
class Region:
    url: str
    key: str
    replica_ports: dict[str, int]

    def openai(self) -> openai.OpenAI:
        return client(self.url, self.key)


@pytest.fixture(scope="module")
def region(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Region]:
    ports = {"px-a": free_port(), "px-b": free_port()}
    balancer_port = free_port()
    us = topology.region("px-us")
    topology.balancer("px-us-lb", us, balancer_port)
    for name, port in ports.items():
        topology.replica(name, us, port)
    topology.service(queue_max_len=0)
    key = topology.api_key()
    start_replicas(module_processes, "px-replicas", ports)
    url = start_balancer(
        module_processes,
        {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"},
        "px-us-lb",
        balancer_port,
        MERIDIAN_REPLICA_MAX_OUTSTANDING="1",
        MERIDIAN_MAX_BODY_BYTES="65536",
        # The "hang" fault stalls /metrics too; here a hung region must stay healthy
        # but full (429), so probe failures never flip health in this module (the
        # forwarding module covers probe-driven health).
        MERIDIAN_PROBE_FAILURE_THRESHOLD="1000",
    )
    yield Region(url, key, ports)


@pytest.fixture
def idle(region: Region) -> Iterator[Region]:
    """The region with nothing in flight and every replica available (SP-P: a fresh
    probe shows no waiting request) before the test; faults cleared after it."""
    eventually(lambda: _is_idle(state(region.url)), what="idle before the test")
    yield region
    for port in region.replica_ports.values():
        set_fault(port, "none")


def test_chat_completion_non_streaming(idle: Region) -> None:
    raw = idle.openai().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=8
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert raw.headers["x-meridian-balancer"] == "px-us-lb"
    assert raw.headers["x-meridian-replica"] in idle.replica_ports


def test_streaming_without_include_usage_gets_no_usage_chunk(idle: Region) -> None:
    stream = idle.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count"}], max_tokens=6, stream=True
    )
    chunks = list(stream)
    # The balancer asked the replica for usage; a client that did not must not see it.
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_streaming_with_include_usage_reports_cached_prompt_tokens(idle: Region) -> None:
    api = idle.openai()
    cached = []
    # Two replicas and four identical prompts: at least two land on one replica,
    # and the later of those finds the prompt's blocks in its prefix cache.
    for _ in range(4):
        chunks = list(
            api.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": LONG_PROMPT}],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
        assert usage is not None and chunks[-1].choices == []
        assert usage.prompt_tokens > 32
        assert usage.prompt_tokens_details is not None
        cached.append(usage.prompt_tokens_details.cached_tokens or 0)
    assert max(cached) > 0
    replicas = eventually(
        lambda: [r for r in state(idle.url)["replicas"] if r["cached_tokens"] > 0],
        what="cached tokens recorded by the balancer",
    )
    assert all(0 < r["cached_token_ratio"] <= 1 for r in replicas)
    assert metric_value(idle.url, "meridian_cached_prompt_tokens_total") >= max(cached)


def test_completions_streaming_and_not(idle: Region) -> None:
    api = idle.openai()
    completion = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert completion.choices[0].text and completion.usage is not None
    chunks = list(api.completions.create(model=MODEL, prompt="Hi", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_models_lists_the_served_model_and_needs_a_key(idle: Region) -> None:
    assert [m.id for m in idle.openai().models.list()] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        client(idle.url, "mk-not-a-key").models.list()


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        (b'{"model": ', 400, None, "invalid_json"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model", None),
        (b'{"model": "meridian-test"}', 400, "messages", None),
        (b'{"model": "meridian-test", "messages": "x"}', 400, "messages", "invalid_type"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model", None),
    ],
)
def test_bad_requests_get_openai_error_bodies(
    idle: Region, body: bytes, status: int, param: str | None, code: str | None
) -> None:
    response = http_probe.post(
        f"{idle.url}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {idle.key}", "Content-Type": "application/json"},
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    if code:
        assert error["code"] == code
    if status == 404:
        assert error["code"] == "model_not_found"


def test_sdk_sees_unknown_model_and_bad_key_as_their_exceptions(idle: Region) -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.NotFoundError):
        idle.openai().chat.completions.create(model="gpt-nope", messages=messages)  # type: ignore[arg-type]
    with pytest.raises(openai.AuthenticationError) as info:
        client(idle.url, "mk-wrong").chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert info.value.code == "invalid_api_key"


def test_oversized_body_is_refused_with_413(idle: Region) -> None:
    prompt = "x" * 70_000
    response = http_probe.post(
        f"{idle.url}/v1/completions",
        json={"model": MODEL, "prompt": prompt},
        headers={"Authorization": f"Bearer {idle.key}"},
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_chunked_upload_without_content_length_is_refused_past_the_limit(idle: Region) -> None:
    def body() -> Iterator[bytes]:
        for _ in range(64):  # 1 MiB, well past the test balancer's limit
            yield b"x" * 16384

    try:
        response = http_probe.post(
            f"{idle.url}/v1/completions",
            content=body(),
            headers={"Authorization": f"Bearer {idle.key}", "Content-Type": "application/json"},
        )
    except httpx.RemoteProtocolError:
        pytest.fail("the balancer hung up without answering 413")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_client_disconnect_mid_stream_cancels_the_replica_request(idle: Region) -> None:
    for port in idle.replica_ports.values():
        set_fault(port, "slow", factor=200.0)  # a generation that outlives the test
    aborts_before = _replica_aborts(idle)
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            f"{idle.url}/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "tell a long story"}],
                "max_tokens": 4000,
                "stream": True,
            },
            headers={"Authorization": f"Bearer {idle.key}"},
        ) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        assert state(idle.url)["inflight"] == 1
    # The client is gone: the replica must see the cancel and the balancer forget it.
    eventually(lambda: _replica_aborts(idle) > aborts_before, what="replica counted an abort")
    eventually(lambda: _replica_busy(idle) == 0, what="replica running+waiting back to 0")
    final = eventually(
        lambda: (s := state(idle.url))["inflight"] == 0 and s, what="balancer in-flight 0"
    )
    assert all(r["outstanding"] == 0 for r in final["replicas"])
    assert metric_value(idle.url, 'meridian_requests_total{model="meridian-test",status="499"') >= 1


def test_client_giving_up_before_the_first_byte_releases_its_slot(idle: Region) -> None:
    for port in idle.replica_ports.values():
        set_fault(port, "hang")
    with pytest.raises(httpx.ReadTimeout):
        http_probe.post(
            f"{idle.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer {idle.key}"},
            timeout=httpx.Timeout(10, read=1.0),
        )
    eventually(lambda: state(idle.url)["inflight"] == 0, what="slot released after the client left")


def test_full_region_answers_429_with_retry_after(idle: Region) -> None:
    for port in idle.replica_ports.values():
        set_fault(port, "hang")  # accepted, never answered: both slots stay taken
    results: list[int] = []

    def held_request() -> None:
        response = http_probe.post(
            f"{idle.url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            headers={"Authorization": f"Bearer {idle.key}"},
            timeout=60,
        )
        results.append(response.status_code)

    held = [threading.Thread(target=held_request) for _ in range(2)]
    for thread in held:
        thread.start()
    eventually(lambda: state(idle.url)["inflight"] == 2, what="both replicas at their cap")
    with pytest.raises(openai.RateLimitError) as info:
        idle.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "one more"}]
        )
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.code == "queue_full"
    for port in idle.replica_ports.values():
        set_fault(port, "none")
    for thread in held:
        thread.join(timeout=30)
    assert results == [200, 200]


def test_redis_down_does_not_break_local_serving(idle: Region) -> None:
    view = state(idle.url)
    assert view["redis"]["connected"] is False and view["redis"]["last_error"]
    assert http_probe.get(f"{idle.url}/health").status_code == 200
    completion = idle.openai().completions.create(model=MODEL, prompt="still here", max_tokens=2)
    assert completion.choices[0].text
    assert metric_value(idle.url, "meridian_heartbeat_errors_total") >= 1


def test_metrics_and_state_describe_the_balancer(idle: Region) -> None:
    idle.openai().completions.create(model=MODEL, prompt="count me", max_tokens=2)
    found = samples(idle.url)
    assert found["meridian_inflight_requests"] == [0.0]
    assert found["meridian_queue_length"] == [0.0]
    assert (
        metric_value(
            idle.url, 'meridian_requests_total{model="meridian-test",status="200",route="local"}'
        )
        >= 1
    )
    assert metric_value(idle.url, "meridian_request_duration_seconds_count") >= 1
    assert metric_value(idle.url, "meridian_ttft_seconds_count") >= 1
    assert len(found["meridian_replica_outstanding"]) == 2
    view = state(idle.url)
    assert view["balancer"] == "px-us-lb" and view["region"] == "px-us"
    assert {r["name"] for r in view["replicas"]} == set(idle.replica_ports)
    assert all(r["healthy"] for r in view["replicas"])
    assert view["models"] == [
        {
            "model": MODEL,
            "policy": "least_load",
            "remote_policy": "nearest",
            "pushing": "sp-p",
            "queue_max_len": 0,
            "queue_max_wait_s": 30.0,
            # No tokenizer files configured: routing says it uses the fallback.
            "tokens": {"tokenizer": "fallback", "chat_template": "fallback"},
            "lora_adapters": [],
            # The emulated replicas' vllm:cache_config_info gave the block size.
            "block_identity": {
                "mode": "token_ids",
                "block_size": 16,
                "block_size_source": "engine",
                "engine_hash_algo": "sha256",
            },
        }
    ]
    (queue,) = view["queues"]
    assert (queue["model"], queue["length"], queue["oldest_wait_s"]) == (MODEL, 0, 0.0)
    # queue_max_len=0: the 429s of the full-region test were refusals, never waits.
    assert queue["placed"] == queue["timed_out"] == queue["cancelled"] == 0


def test_the_lookahead_map_holds_a_running_request_and_predictions_are_counted(
    idle: Region,
) -> None:
    before = metric_value(idle.url, "meridian_length_predictions_total")
    for port in idle.replica_ports.values():
        set_fault(port, "hang")  # the request reaches a replica and stays there
    done: list[int] = []

    def send() -> None:
        completion = idle.openai().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Write a haiku"}], max_tokens=12
        )
        assert completion.usage is not None
        done.append(completion.usage.completion_tokens)

    sender = threading.Thread(target=send)
    sender.start()
    try:

        def running() -> list[dict[str, Any]]:
            return [r for r in state(idle.url)["replicas"] if r["forecast"]["running"]]

        (row,) = eventually(running, what="the request in its replica's look-ahead map")
        forecast = row["forecast"]
        # Its prompt and the tokens its iterations so far would have decoded (the map
        # cannot see that the replica is stalled), and no less ahead.
        assert forecast["peak_kv_tokens"] >= forecast["kv_tokens"] > 0
        assert len(forecast["lookahead"]) == state(idle.url)["lookahead_iterations"]
        gauge = f'meridian_anticipated_kv_tokens{{replica="{row["name"]}",stat="peak"}}'
        assert metric_value(idle.url, gauge) > 0
    finally:
        for port in idle.replica_ports.values():
            set_fault(port, "none")
        sender.join(timeout=30)
    assert done and done[0] <= 12
    view = state(idle.url)
    assert view["length_predictor"] == "learned"
    assert all(r["forecast"]["running"] == 0 for r in view["replicas"])
    assert metric_value(idle.url, "meridian_length_predictions_total") == before + 1
    # The engine's completion tokens were set against the prediction (at most max_tokens).
    assert metric_value(idle.url, "meridian_length_predicted_tokens_total") >= 1
    assert "meridian_length_prediction_error_tokens_total" in samples(idle.url)


def _is_idle(view: dict[str, Any]) -> bool:
    replicas = view["replicas"]
    return view["inflight"] == 0 and all(r["healthy"] and r["available"] for r in replicas)


def _replica_aborts(region: Region) -> float:
    """Requests the replicas finished as aborted (vLLM's finished_reason="abort")."""
    total = 0.0
    for port in region.replica_ports.values():
        text = http_probe.get(f"http://127.0.0.1:{port}/metrics").text
        for line in text.splitlines():
            if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def _replica_busy(region: Region) -> float:
    total = 0.0
    for port in region.replica_ports.values():
        found = samples(f"http://127.0.0.1:{port}")
        total += sum(found["vllm:num_requests_running"]) + sum(found["vllm:num_requests_waiting"])
    return total
