"""The replica over real HTTP: the OpenAI API with httpx and the official client, metrics."""

from __future__ import annotations

import json

import httpx
import msgpack
import openai
import pytest
import zmq

from core.block_identity import BlockIdentityMode, BlockScheme
from core.engine_metrics import parse_engine_load
from core.tokenizer import WordTokenizer, render_chat
from ops import http_probe
from tests.support.engine import fresh_prompt
from tests.support.polling import eventually
from tests.support.sim_serve import ServedReplicas

pytestmark = pytest.mark.integration

MODEL = "meridian-demo"


def client(served: ServedReplicas, replica: str = "a") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.urls[replica]}/v1", api_key="unused", max_retries=0)


def wait_until_idle(served: ServedReplicas, replica: str) -> None:
    def idle() -> bool:
        running = served.metric("vllm:num_requests_running", replica)
        return running + served.metric("vllm:num_requests_waiting", replica) == 0

    eventually(idle, what=f"replica {replica} has no requests left", timeout=15)


def test_models_and_health(served: ServedReplicas) -> None:
    assert http_probe.get(f"{served.urls['a']}/health").status_code == 200
    models = client(served).models.list()
    assert [m.id for m in models.data] == [MODEL, "sql-expert"]


def test_a_lora_adapter_is_served_and_reported(served: ServedReplicas) -> None:
    completion = client(served, "b").completions.create(
        model="sql-expert", prompt="select", max_tokens=2
    )
    assert completion.model == "sql-expert"
    text = http_probe.get(f"{served.urls['b']}/metrics").text
    assert 'vllm:lora_requests_info{max_lora="4",running_lora_adapters=""' in text
    # The balancer reads the emulator's series as it reads vLLM's: the latest label set.
    info = parse_engine_load(text).lora
    assert info is not None and (info.max_lora, info.active) == (4, frozenset())


def test_streaming_chat_with_usage_through_the_openai_client(served: ServedReplicas) -> None:
    messages = [{"role": "user", "content": "Tell me about the harbour at dawn, in detail."}]
    stream = client(served).chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.prompt_tokens == len(WordTokenizer().encode(render_chat(messages)))
    # One generated word is one token under the shared tokenizer.
    assert usage.completion_tokens == len(WordTokenizer().encode(text)) <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert finish in (["stop"], ["length"])


def test_repeated_prompt_reports_cached_tokens(served: ServedReplicas) -> None:
    prompt = " ".join(f"w{i}" for i in range(300))
    first = client(served).completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    second = client(served).completions.create(model=MODEL, prompt=prompt, max_tokens=3)
    assert first.usage is not None and second.usage is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    # 300 tokens = 18 full blocks; the cap at n-1 tokens still hits all 18.
    assert second.usage.prompt_tokens_details.cached_tokens == 288  # type: ignore[union-attr]
    assert second.choices[0].text.strip()


def test_non_streaming_chat_and_token_id_prompts_over_httpx(served: ServedReplicas) -> None:
    url = served.urls["b"]
    chat = http_probe.post(
        f"{url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
    ).json()
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] <= 5
    capped = http_probe.post(
        f"{url}/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 3,
            "ignore_eos": True,
        },
    ).json()
    assert capped["usage"]["completion_tokens"] == 3
    ids = fresh_prompt(40)
    completion = http_probe.post(
        f"{url}/v1/completions",
        json={"model": MODEL, "prompt": ids, "max_tokens": 4, "ignore_eos": True},
    ).json()
    assert completion["usage"]["prompt_tokens"] == 40
    assert completion["usage"]["completion_tokens"] == 4
    assert completion["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"model": "other", "prompt": "x"}', 404, "model"),
        (b'{"model": "meridian-demo", "prompt": "x", "n": 2}', 400, "n"),
        (b'{"model": "meridian-demo", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"model": "meridian-demo", "prompt": "x", "stream_options": {}}', 400, "stream"),
        (json.dumps({"model": MODEL, "prompt": list(range(9000))}).encode(), 400, "prompt"),
    ],
)
def test_invalid_requests_get_openai_style_errors(
    served: ServedReplicas, body: bytes, status: int, param: str | None
) -> None:
    response = http_probe.post(f"{served.urls['a']}/v1/completions", content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param


def test_a_priority_is_taken_by_an_engine_that_does_not_schedule_by_it(
    served: ServedReplicas,
) -> None:
    """The replicas schedule first come, first served (vLLM's default), and take a
    request's ``priority`` without reading it, as vLLM 0.32 does (``tests/engines``);
    one that is not an integer is the client's 400."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1, "priority": 1}
    answer = http_probe.post(f"{served.urls['a']}/v1/completions", json=body)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 1
    wrong = http_probe.post(f"{served.urls['a']}/v1/completions", json={**body, "priority": "high"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "priority"


def test_too_long_request_is_a_bad_request_for_the_client(served: ServedReplicas) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client(served).completions.create(model=MODEL, prompt="hello", max_tokens=100_000)


def test_metrics_use_vllm_names(served: ServedReplicas) -> None:
    client(served).completions.create(model=MODEL, prompt="count me", max_tokens=2)
    text = http_probe.get(f"{served.urls['a']}/metrics").text
    for name in (
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:gpu_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:prompt_tokens_total{",
        "vllm:generation_tokens_total{",
        "vllm:num_preemptions_total{",
        'vllm:request_success_total{engine="0",model_name="meridian-demo",finished_reason="abort"}',
        'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="meridian-demo",le="+Inf"}',
        "vllm:e2e_request_latency_seconds_count{",
    ):
        assert name in text, name
    assert served.metric("vllm:generation_tokens_total", "a") >= 2
    assert served.metric("vllm:time_to_first_token_seconds_count", "a") >= 1
    # The engine's cache config, where a balancer learns the model's block size.
    load = parse_engine_load(text)
    assert (load.block_size, load.hash_algo) == (16, "sha256")


def test_client_disconnect_mid_stream_aborts_the_request(served: ServedReplicas) -> None:
    aborted = served.metric("vllm:request_success_total", "a", finished_reason="abort")
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 5000, "ignore_eos": True}
    body["stream"] = True
    with httpx.stream("POST", f"{served.urls['a']}/v1/completions", json=body) as response:
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6), strict=False) if line]
    assert received and received[0].startswith("data: ")
    wait_until_idle(served, "a")
    assert served.metric("vllm:request_success_total", "a", finished_reason="abort") == aborted + 1
    assert served.metric("vllm:kv_cache_usage_perc", "a") == 0.0


def test_client_disconnect_during_prefill_aborts_a_non_streaming_request(
    served: ServedReplicas,
) -> None:
    url = served.urls["b"]
    generated = served.metric("vllm:generation_tokens_total", "b")
    aborted = served.metric("vllm:request_success_total", "b", finished_reason="abort")
    # Slow the GPU 50x so the 3-chunk prefill of 6000 tokens outlasts the client's patience.
    http_probe.post(f"{url}/fault", json={"mode": "slow", "factor": 50})
    try:
        with pytest.raises(httpx.ReadTimeout):
            http_probe.post(
                f"{url}/v1/completions",
                json={"model": MODEL, "prompt": fresh_prompt(6000), "max_tokens": 10},
                timeout=httpx.Timeout(5.0, read=0.5),
            )
        wait_until_idle(served, "b")
    finally:
        http_probe.post(f"{url}/fault", json={"mode": "none"})
    assert served.metric("vllm:generation_tokens_total", "b") == generated
    assert served.metric("vllm:request_success_total", "b", finished_reason="abort") == aborted + 1


def test_kv_events_carry_vllms_block_hashes_and_fields(served: ServedReplicas) -> None:
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(f"tcp://127.0.0.1:{served.kv_port_base}")  # replica "a" is index 0
    try:
        for attempt in range(20):  # PUB drops until the subscription has propagated
            prompt = f"kv event probe {attempt} " + " ".join(f"t{i}" for i in range(40))
            tokens = WordTokenizer().encode(prompt)
            expected = BlockScheme(BlockIdentityMode.VLLM).keys(tokens)
            client(served).completions.create(model=MODEL, prompt=prompt, max_tokens=1)
            while socket.poll(300):
                topic, seq, payload = socket.recv_multipart()
                timestamp, events, rank = msgpack.unpackb(payload)
                stored = [
                    e
                    for e in events
                    if e["type"] == "BlockStored" and e["block_hashes"] == expected
                ]
                if stored:
                    assert topic == b"" and len(seq) == 8 and rank == 0 and timestamp > 0
                    # vLLM 0.32's fields, in its order (msgspec's map encoding).
                    assert list(stored[0]) == [
                        "type", "block_hashes", "parent_block_hash", "token_ids",
                        "block_size", "lora_id", "medium", "lora_name", "extra_keys",
                        "group_idx",
                    ]  # fmt: skip
                    assert stored[0]["token_ids"] == tokens[: 16 * len(expected)]
                    assert (stored[0]["parent_block_hash"], stored[0]["block_size"]) == (None, 16)
                    assert (stored[0]["medium"], stored[0]["lora_name"]) == ("GPU", None)
                    return
        raise AssertionError("no BlockStored event with the expected hashes arrived")
    finally:
        socket.close()
