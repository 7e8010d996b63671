"""The bare proxy of ``bench proxy --bare``: it relays what a backend answers, streamed
or not, round-robin, and says 502 for a backend it cannot reach.

Real processes on loopback: an emulated replica, the bare proxy under uvicorn, and the
official ``openai`` client, as the bench's load generator speaks to it.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from ops import http_probe
from ops.bench.bare import BareProxy, running_bare
from tests.support.commands import run_command
from tests.support.processes import ProcessGroup, free_port
from tests.support.sim_serve import start_replicas

pytestmark = pytest.mark.integration

MODEL = "meridian-demo"
PROMPT = [{"role": "user", "content": "hello " * 50}]


def test_answers_and_streams_relay_what_the_replicas_say(
    processes: ProcessGroup, tmp_path: Path
) -> None:
    served = start_replicas(processes, ["a", "b"], "--profile", "zero")
    with running_bare(list(served.urls.values()), tmp_path) as bare:
        client = openai.OpenAI(base_url=bare.url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=12, extra_body={"ignore_eos": True}
        )
        assert answer.usage is not None and answer.usage.completion_tokens == 12
        assert answer.choices[0].message.content

        stream = client.chat.completions.create(
            model=MODEL, messages=PROMPT, max_tokens=9, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 9

    # Round-robin: the two requests went one to each replica.
    for name in ("a", "b"):
        assert served.metric("vllm:request_success_total", name) == 1


def test_an_unreachable_backend_is_a_502_and_the_proxy_keeps_answering(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with running_bare([dead], tmp_path) as bare:
        response = http_probe.post(bare.url + "/v1/chat/completions", json={}, timeout=10)
        assert response.status_code == 502
        assert http_probe.get(bare.url + "/health", timeout=5).status_code == 200


def test_a_bare_proxy_needs_backends() -> None:
    with pytest.raises(ValueError, match="MERIDIAN_BARE_BACKENDS"):
        BareProxy([])


def test_beside_an_existing_deployment_it_needs_only_the_backends(
    processes: ProcessGroup,
) -> None:
    served = start_replicas(processes, ["a"], "--profile", "zero")
    url = served.urls["a"]
    # The replica itself stands in for the deployment's balancer.
    text = run_command(
        "bench", "proxy", "--backend", url, "--balancer", url, "--bare", "--mode", "nonstream",
        "--concurrency", "2", "--requests", "4", "--model", MODEL,
    )  # fmt: skip
    rows = [line.split() for line in text.splitlines() if line.split()[:1] == ["nonstream"]]
    served_by = [(row[2], row[3], row[4]) for row in rows]  # server, ok, err
    assert served_by == [("balancer", "4", "0"), ("bare", "4", "0")]
