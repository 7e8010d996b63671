"""The model's own tokens end to end: emulated replicas given the model's tokenizer files
(``--tokenizer DIR``, as vLLM), a balancer configured with the same files, and one left
on the fallback, all over real sockets with KV events.

The model's chat template (``ops.bench.model_fixture``: headers, end-of-turn tokens, a
BOS token) differs from Meridian's fixed rendering, as a real model's does.  A correctly
configured balancer hashes the very blocks the engine caches, so ``cache_map`` sends a
conversation's second turn to the replica holding its first, and the ``cached_tokens``
the engine reports is within one block of what the balancer's hashes find there.  A
balancer on the fallback hashes a prompt the engine never sees: it finds nothing, while
the engine serves most of the prompt from cache, the vLLM production stack's bug.

The expectation is what a balancer with a given encoder finds on the serving replica:
the prompt's tokens under that encoder, keyed in full blocks the way the engine keys
them (the emulator's defaults: vLLM's sha256 chain, 16-token blocks), looked up among
the blocks the replica reports holding.  The balancer itself keys the engine's events
from their token ids, which finds the same prefix when the tokens agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from core.block_identity import BlockIdentityMode, BlockScheme
from core.model_tokenizer import ModelTokenizer
from core.prompts import ChatPrompt, FallbackEncoder, PromptEncoder, prompt_tokens
from ops import http_probe
from ops.bench.model_fixture import write_model_tokenizer
from routing.model_tokens import read_tokenizer_files
from sim.workloads.text import WORDS
from tests.support.balancers import TopologyFactory, start_balancer, start_replicas, state
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port, free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MODEL = "meridian-model-tokens"
NAMES = ("mt-a", "mt-b")
ENGINE = BlockScheme(mode=BlockIdentityMode.VLLM)  # how the emulated replicas key blocks
BLOCK_SIZE = ENGINE.block_size


@dataclass(frozen=True)
class Lab:
    balancer: str  # configured with the model's tokenizer files
    fallback: str  # the same replicas, no tokenizer files: Meridian's fallback
    key: str
    replicas: dict[str, str]  # name -> url
    model: ModelTokenizer

    def chat(self, url: str, messages: list[dict[str, str]]) -> tuple[str, dict[str, Any], str]:
        """``messages`` sent to ``url``: the reply, its usage, the replica that served it."""
        headers = {"Authorization": f"Bearer {self.key}"}
        body = {"model": MODEL, "messages": messages, "max_tokens": 24}
        response = http_probe.post(
            f"{url}/v1/chat/completions", json=body, headers=headers, timeout=30
        )
        response.raise_for_status()
        answer = response.json()
        served = response.headers.get("X-Meridian-Replica") or ""
        return answer["choices"][0]["message"]["content"], answer["usage"], served

    def held_prefix(
        self, replica: str, messages: list[dict[str, str]], encoder: PromptEncoder
    ) -> int:
        """Tokens of the prompt's longest block prefix that ``replica`` holds, as a balancer
        with ``encoder`` hashes it."""
        hashes = ENGINE.keys(prompt_tokens(ChatPrompt(messages), encoder))
        held = set(http_probe.get(f"{self.replicas[replica]}/kv_cache/blocks").json()["blocks"])
        depth = next((i for i, h in enumerate(hashes) if h not in held), len(hashes))
        return depth * BLOCK_SIZE

    def wait_applied(self, url: str, replica: str) -> None:
        sequence = http_probe.get(f"{self.replicas[replica]}/kv_cache/blocks").json()["sequence"]

        def applied() -> bool:
            row = state(url)["kv_events"]["replicas"].get(replica) or {}
            return (row.get("next_sequence") or 0) >= sequence and row.get("pending") == 0

        eventually(applied, what=f"{replica}'s events through {sequence} applied at {url}")


def conversation(tag: str, words: int = 300) -> list[dict[str, str]]:
    """A system prompt and a first question, distinct per ``tag``."""
    text = " ".join(WORDS[(i * 7 + len(tag) * 13) % len(WORDS)] for i in range(words))
    return [
        {"role": "system", "content": f"Conversation {tag}. {text.capitalize()}."},
        {"role": "user", "content": f"What does {tag} say about {WORDS[len(tag)]}?"},
    ]


def next_turn(messages: list[dict[str, str]], reply: str) -> list[dict[str, str]]:
    return [*messages, {"role": "assistant", "content": reply},
            {"role": "user", "content": "Tell me more about that, please."}]  # fmt: skip


@pytest.fixture(scope="module")
def lab(
    topology: TopologyFactory,
    child_env: dict[str, str],
    module_processes: ProcessGroup,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Lab]:
    model_dir = write_model_tokenizer(Path(tmp_path_factory.mktemp("model")))
    region = topology.region("mt-lab")
    ports = {name: free_port() for name in NAMES}
    for name, port in ports.items():
        topology.replica(name, region, port, model=MODEL)
    kv_base = str(free_port_run(len(NAMES)))
    start_replicas(
        module_processes, "mt", ports, "--kv-events-port-base", kv_base,
        "--tokenizer", str(model_dir), model=MODEL,
    )  # fmt: skip
    # Blind pushing: these tests are about the cache map's choice alone.
    topology.service(MODEL, policy="cache_map", policy_params={"pushing": "blind"})
    key = topology.api_key()
    urls = {}
    for name, extra in (
        ("mt-lb", {"MERIDIAN_MODEL_TOKENIZERS": f"{MODEL}={model_dir}"}),
        ("mt-fallback-lb", {}),
    ):
        port = free_port()
        topology.balancer(name, region, port)
        env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
        urls[name] = start_balancer(module_processes, env, name, port, **extra)
    for url in urls.values():

        def subscribed(url: str = url) -> bool:
            view = state(url)
            streams = view["kv_events"]["replicas"]
            return set(NAMES) <= set(streams) and all(r["healthy"] for r in view["replicas"])

        eventually(subscribed, what=f"{url} subscribed to both replicas' KV events")
    model = ModelTokenizer(read_tokenizer_files(str(model_dir)))
    replicas = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    yield Lab(urls["mt-lb"], urls["mt-fallback-lb"], key, replicas, model)


def settle_subscriptions(lab: Lab) -> None:
    """ZMQ subscriptions propagate asynchronously: publish until both balancers have seen
    both replicas' events, so no later message is dropped for want of a subscriber."""
    for attempt in range(50):
        for name in NAMES:
            lab.chat(lab.replicas[name], conversation(f"warm-{name}-{attempt}", words=40))
        rows = [state(url)["kv_events"]["replicas"] for url in (lab.balancer, lab.fallback)]
        if all(row[n]["received"] > 0 for row in rows for n in NAMES):
            return
    raise AssertionError("the balancers never received the replicas' KV events")


def test_each_balancer_reports_where_its_tokens_come_from(lab: Lab) -> None:
    def tokens(url: str) -> dict[str, str]:
        return next(m["tokens"] for m in state(url)["models"] if m["model"] == MODEL)

    assert tokens(lab.balancer)["chat_template"].endswith("(tokenizer_config.json)")
    assert tokens(lab.fallback) == {"tokenizer": "fallback", "chat_template": "fallback"}


def test_turn_two_goes_to_turn_ones_replica_and_the_cached_tokens_match(lab: Lab) -> None:
    settle_subscriptions(lab)
    for index in range(4):
        holder = NAMES[index % 2]  # first turns placed on both replicas, behind the balancer
        first = conversation(f"placed-{index}")
        reply, usage, _ = lab.chat(lab.replicas[holder], first)
        assert usage["prompt_tokens"] == len(prompt_tokens(ChatPrompt(first), lab.model))
        lab.wait_applied(lab.balancer, holder)
        second = next_turn(first, reply)
        expected = lab.held_prefix(holder, second, lab.model)  # when the balancer decides
        _, usage, served = lab.chat(lab.balancer, second)
        assert served == holder  # the balancer saw the engine's blocks in its events
        assert expected >= 256  # the system prompt and the first question, at least
        assert abs(usage["prompt_tokens_details"]["cached_tokens"] - expected) <= BLOCK_SIZE


def test_a_balancer_on_the_fallback_sees_none_of_the_engines_cache(lab: Lab) -> None:
    settle_subscriptions(lab)
    first = conversation("misconfigured")
    reply = ""
    for name in NAMES:  # both replicas hold the first turn: any choice is a cache hit
        reply, _, _ = lab.chat(lab.replicas[name], first)
        lab.wait_applied(lab.fallback, name)
    second = next_turn(first, reply)
    # What each balancer finds on each replica when it decides.
    fallback_finds = {name: lab.held_prefix(name, second, FallbackEncoder()) for name in NAMES}
    model_finds = {name: lab.held_prefix(name, second, lab.model) for name in NAMES}
    assert fallback_finds == dict.fromkeys(NAMES, 0)  # hashes of a prompt no engine saw
    _, usage, served = lab.chat(lab.fallback, second)
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 256 > fallback_finds[served] + BLOCK_SIZE
    # A correctly configured balancer would have expected what the engine served.
    assert abs(cached - model_finds[served]) <= BLOCK_SIZE
