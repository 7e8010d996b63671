"""The balancer's view of the real engines' caches: lost events healed from vLLM's replay
endpoint, and the hit-rate mismatch detector, quiet when the view is right (a scripted
multi-turn workload: expected cached tokens within one block of what vLLM reports),
firing when the hash seed is wrong, and telling a prefix the engine evicted while it
waited (its own BlockRemoved events) from a wrong view."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import pytest
from django.conf import settings

from core.kv_events import REMOVED, STORED
from ops import http_probe
from tests.engines.conftest import (
    BLOCK_SIZE,
    EVICTING_MODEL,
    EVICTING_SUFFIX,
    WRONG_SEED_MODEL,
    WRONG_SEED_SUFFIX,
)
from tests.engines.fleet import (
    EngineFleet,
    EventTap,
    RawMessage,
    VllmReplica,
    balancer_hears,
    cached_tokens,
    event_tap,
    prompt_blocks_only,
    reusable_tokens,
    settle,
    unique_prompt,
    wait_applied,
)
from tests.support.balancers import state
from tests.support.metrics import metric
from tests.support.polling import eventually

pytestmark = [pytest.mark.engines, pytest.mark.django_db, pytest.mark.timeout(1200)]


def lose_next_event(fleet: EngineFleet, replica: str) -> None:
    """The balancer will lose ``replica``'s next KV-event message before its sequence
    check, as when the PUB socket drops it past its high-water mark.  Only that
    replica's: the wrong-seed service's replica of the same engine hears the same
    publisher, and whichever stream reads the message first would lose it."""
    headers = {"Authorization": f"Bearer {settings.MERIDIAN_INTERNAL_TOKEN}"}
    fault = {"lose_kv_events": 1, "kv_fault_replica": replica}
    url = f"{fleet.url}/internal/faults"
    answer = http_probe.post(url, json=fault, headers=headers, timeout=10)
    assert answer.json()["lose_kv_events"] == 1
    assert answer.json()["kv_fault_replica"] == replica


def lose_the_events_of(fleet: EngineFleet, replica: str, prompt: str) -> None:
    """Cache ``prompt`` on ``replica`` behind the balancer's back, with the message that
    carries its BlockStored lost on the way."""
    balancer_hears(fleet, replica)
    lose_next_event(fleet, replica)
    fleet.direct_client(replica).completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
    eventually(lambda: state(fleet.url)["faults"]["lose_kv_events"] == 0, what="the message lost")


def test_a_gap_is_healed_from_the_engines_replay_endpoint(fleet: EngineFleet) -> None:
    name = "vllm-b"
    before = fleet.kv_stream_state(name)
    lose_the_events_of(fleet, name, unique_prompt(150))
    # The next message reveals the gap; the balancer asks vLLM's replay endpoint for the
    # lost one and applies it.
    received = fleet.kv_stream_state(name)["received"]
    fleet.direct_client(name).completions.create(
        model=fleet.model, prompt=unique_prompt(150), max_tokens=1
    )
    wait_applied(fleet, name, received)

    def healed() -> dict[str, Any] | None:
        row = fleet.kv_stream_state(name)
        replays = row["healed_by"].get("replay", 0)
        return row if replays > before["healed_by"].get("replay", 0) else None

    row = eventually(healed, what=f"the gap in {name}'s events healed by replay", timeout=30)
    assert row["gaps"] == before["gaps"] + 1
    assert set(row["healed_by"]) == set(before["healed_by"]) | {"replay"}


def test_a_prefix_whose_events_were_lost_is_steered_after_the_replay(fleet: EngineFleet) -> None:
    holder = "vllm-b"  # an idle tie goes to vllm-a: only the replayed events pick vllm-b
    prefix = unique_prompt(300)
    # The replay count is cumulative over the fleet's life (an earlier test healed a gap
    # too): wait for this gap's own replay, not for any replay at all.
    replays_before = fleet.kv_stream_state(holder)["healed_by"].get("replay", 0)
    lose_the_events_of(fleet, holder, prefix)
    received = fleet.kv_stream_state(holder)["received"]
    fleet.direct_client(holder).completions.create(
        model=fleet.model, prompt=unique_prompt(150), max_tokens=1
    )
    wait_applied(fleet, holder, received)
    eventually(
        lambda: fleet.kv_stream_state(holder)["healed_by"].get("replay", 0) > replays_before,
        what="this gap healed by replay",
        timeout=30,
    )
    replica, response = fleet.complete(prefix + " and what follows it")
    assert replica == holder and cached_tokens(response.usage) > 0


# -- the hit-rate mismatch detector ----------------------------------------------------


def cache_view(fleet: EngineFleet, replica: str) -> dict[str, Any]:
    row = next(r for r in state(fleet.url)["replicas"] if r["name"] == replica)
    return {**(row["cache_view"] or {}), "warnings": row["warnings"]}


def converse(fleet: EngineFleet, turns: int, opening: str) -> None:
    """One scripted conversation through the balancer: each turn sends the whole history,
    the engine's own earlier replies included, plus a new user message, and waits until
    the balancer applied the serving replica's events (so the next turn's expectation
    is taken on a settled map, not raced against the event stream)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": opening}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn}: " + unique_prompt(60)})
        received = {n: fleet.kv_stream_state(n)["received"] for n in fleet.replicas}
        raw = fleet.client().chat.completions.with_raw_response.create(
            model=fleet.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            temperature=0,
        )
        replica = raw.headers["X-Meridian-Replica"]
        reply = raw.parse().choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        wait_applied(fleet, replica, received[replica])


def test_expected_cached_tokens_match_the_engines_on_a_multi_turn_workload(
    fleet: EngineFleet,
) -> None:
    for conversation in range(3):
        converse(fleet, turns=4, opening=f"conversation {conversation}: " + unique_prompt(80))
    views = {name: cache_view(fleet, name) for name in fleet.replicas}
    checked = {name: v for name, v in views.items() if v.get("checked_requests")}
    assert checked, views
    for name, view in checked.items():
        # Every request's expectation was within one block of the engine's cached_tokens.
        assert view["mismatch_ratio"] == 0, (name, view)
        assert view["state"] in ("ok", "warming") and not view["warnings"], (name, view)
        assert view["reported_cached_tokens"] > 0, (name, view)  # the turns did hit
    assert any(v["state"] == "ok" for v in checked.values()), views


def test_the_mismatch_detector_fires_when_the_hash_seed_is_wrong(fleet: EngineFleet) -> None:
    """The same engines served as ``WRONG_SEED_MODEL``, whose service keys blocks in
    ``vllm`` mode with a seed that is not the engines' ``PYTHONHASHSEED``: no request
    key matches an event's hash, the balancer expects nothing cached while the engine
    reports hits, and the detector says so in /internal/state and /metrics."""
    client = fleet.client()
    served: set[str] = set()
    for _ in range(4):
        prompt = unique_prompt(150)
        for _ in range(3):  # a miss, then two hits the balancer does not expect
            raw = client.completions.with_raw_response.create(
                model=WRONG_SEED_MODEL, prompt=prompt, max_tokens=1
            )
            served.add(raw.headers["X-Meridian-Replica"])
    assert served <= {name + WRONG_SEED_SUFFIX for name in fleet.replicas}

    def fired() -> list[str]:
        return [r for r in served if cache_view(fleet, r).get("state") == "mismatch"]

    mismatched = eventually(fired, what="the mismatch detector fired")
    for replica in mismatched:
        view = cache_view(fleet, replica)
        assert view["reported_cached_tokens"] > view["expected_cached_tokens"] == 0
        assert [w["kind"] for w in view["warnings"]] == ["cache_view_mismatch"]
        labels = {"replica": replica, "state": "mismatch"}
        assert metric(fleet.url, "meridian_cache_view_state", **labels) == 1


def test_a_prefix_the_engine_evicts_while_it_waits_is_told_from_a_wrong_view(
    fleet: EngineFleet,
) -> None:
    """Each round caches a prompt on vllm-a and fills the engine's eight running slots
    with requests whose decode grows past its cache (both sent to the engine itself, so
    the balancer checks neither); then the prompt is sent again through the balancer.
    It is routed while the map confirms its blocks and waits in vLLM for a slot, while
    the others' decode evicts them (vLLM's BlockRemoved).  The balancer must read this
    as a cache too small for what waits on it, not as a wrong view."""
    engine = "vllm-a"
    row = engine + EVICTING_SUFFIX
    client = fleet.client()
    found: list[int] = []
    expected: list[int] = []
    lost = 0
    with event_tap(fleet.replicas[engine]) as tap, engine_yields(fleet.replicas[engine]) as vllm:
        settle(tap, fleet, engine)
        balancer_hears(fleet, engine, row=row)
        while len(found) < ROUNDS:
            kept = prompt_blocks_only(fleet, 140, BLOCK_SIZE)
            blocks = cache_behind_the_balancers_back(fleet, tap, engine, row, kept)
            since = len(tap.messages)
            fillers = threading.Thread(target=fill_every_slot, args=(fleet, engine))
            fillers.start()
            # Each filler's prompt fills one block, stored (with no parent) when it is
            # prefilled: eight such events and all eight slots run.  (Polling vLLM's
            # /metrics instead reads seconds late: the API server that serves it is busy.)
            tap.stored_until(
                lambda stored: sum(e["parent_block_hash"] is None for e in stored) >= 8,
                what="all eight fillers prefilled",
            )
            answers: list[Any] = []
            sender: threading.Thread | None = None
            with frozen(vllm):
                tap.drain()  # what the engine published before it stopped
                if removed(tap.messages[since:]) & set(blocks):
                    # The decode reached the prompt's blocks before the engine stopped:
                    # this round cannot route it while they are held.  Set it up again.
                    lost += 1
                    assert lost <= ROUNDS, "the engine kept outrunning this test"
                else:
                    # The engine stands still until the balancer has routed the prompt.
                    sender = threading.Thread(
                        target=lambda: answers.append(
                            client.completions.with_raw_response.create(
                                model=EVICTING_MODEL, prompt=kept, max_tokens=1, temperature=0
                            )
                        )
                    )
                    sender.start()
                    eventually(
                        lambda: fleet.replica_state(row)["outstanding"] == 1,
                        what="the prompt routed",
                    )
            fillers.join()
            if sender is None:
                continue
            sender.join()
            (raw,) = answers
            assert raw.headers["X-Meridian-Replica"] == row
            found.append(cached_tokens(raw.parse().usage))
            expected.append(reusable_tokens(len(fleet.prompt_ids(kept)), BLOCK_SIZE))
    # The map expected every block of the prompt each time; the engine had evicted them.
    assert all(e - f > BLOCK_SIZE for e, f in zip(expected, found, strict=True)), (
        expected,
        found,
    )

    def judged() -> dict[str, Any] | None:
        view = cache_view(fleet, row)
        return view if view.get("checked_requests") == ROUNDS else None

    view = eventually(judged, what="every request judged")
    assert view["state"] == "evicting" and view["mismatch_ratio"] == 0.0, view
    assert view["evicted_ratio"] == 1.0 and view["expected_cached_tokens"] == sum(expected)
    assert [w["kind"] for w in view["warnings"]] == ["cache_evicting"]
    labels = {"replica": row, "state": "evicting"}
    assert metric(fleet.url, "meridian_cache_view_state", **labels) == 1


def removed(messages: list[RawMessage]) -> set[int]:
    """The blocks the messages' BlockRemoved events name."""
    return {
        h for m in messages for e in m.events if e["type"] == REMOVED for h in e["block_hashes"]
    }


@contextmanager
def engine_yields(replica: VllmReplica) -> Iterator[list[psutil.Process]]:
    """vLLM's engine (the API server's child processes: the engine core and the worker
    that runs the model), every thread of it, at the lowest CPU priority for the
    block, so that this test sees the fillers' first blocks stored and freezes the
    engine (``frozen``) well before their decode reaches the waiting prompt's blocks
    (about 1.5 s on two shared cores); the engine still decodes at full speed whenever
    nothing else wants the CPU.  (A niceness is a thread's on Linux: the worker's
    OpenMP threads kept theirs, and this test was then starved for 2 s.)  The old
    priorities are restored where the user may restore them (raising one takes
    privilege)."""
    engine = psutil.Process(replica.process.pid).children(recursive=True)
    assert engine, "vLLM's engine processes were not found"
    threads = [psutil.Process(t.id) for process in engine for t in process.threads()]
    before = [thread.nice() for thread in threads]
    for thread in threads:
        thread.nice(19)
    try:
        yield engine
    finally:
        for thread, nice in zip(threads, before, strict=True):
            with contextlib.suppress(psutil.AccessDenied, psutil.NoSuchProcess):
                thread.nice(nice)


@contextmanager
def frozen(processes: list[psutil.Process]) -> Iterator[None]:
    """The processes stopped (SIGSTOP) for the block, and continued after it: the
    engine publishes nothing meanwhile, while its API server still takes requests in.
    Unfrozen, on two busy cores, the balancer was sometimes starved for 2 s and routed
    the prompt only after it had applied the evictions: nothing was expected of it."""
    for process in processes:
        process.suspend()
    try:
        yield
    finally:
        for process in processes:
            process.resume()


# Enough checked requests for a verdict (the fleet's MERIDIAN_CACHE_MISMATCH_MIN_REQUESTS).
ROUNDS = 4
# A filler holds 14 blocks when it finishes: eight of them would hold 112, more than the
# engine's 95 usable blocks (one is vLLM's null block).  Before any of them finishes, the
# engine has evicted every block that no running request holds, the waiting prompt's
# included, and preempts the last filler it admitted.
FILLER_TOKENS = 14 * BLOCK_SIZE


def cache_behind_the_balancers_back(
    fleet: EngineFleet, tap: EventTap, engine: str, row: str, prompt: str
) -> list[int]:
    """Cache ``prompt`` on ``engine`` directly, and wait until the balancer applied the
    very message that stored it on ``row``'s stream (a count of messages received can
    be reached by the tail of an earlier request's events instead).  The engine's
    hashes of the prompt's blocks."""
    fleet.direct_client(engine).completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
    head = fleet.prompt_ids(prompt)[:BLOCK_SIZE]
    stored = [
        (m, e)
        for m in tap.drain()
        for e in m.events
        if e["type"] == STORED and list(e["token_ids"][:BLOCK_SIZE]) == head
    ]
    assert stored, "the prompt's blocks were not stored"
    message, event = stored[-1]
    sequence = int.from_bytes(message.frames[1], "big")

    def applied() -> bool:
        stream = fleet.kv_stream_state(row)
        return stream["next_sequence"] > sequence and stream["pending"] == 0

    eventually(applied, what=f"the balancer applied {row}'s message {sequence}")
    return list(event["block_hashes"])


def fill_every_slot(fleet: EngineFleet, engine: str) -> None:
    """Eight prompts of one full block and a part each (the first block is stored when
    it is prefilled), decoded to about FILLER_TOKENS, in one request: the engine takes
    them in at once.  Eight requests from eight threads reached it seconds apart on a
    busy machine, and the first ones' decode evicted the waiting prompt's blocks before
    the last one was sent."""
    prompts = [unique_prompt(24) for _ in range(8)]
    longest = max(len(fleet.prompt_ids(p)) for p in prompts)
    fleet.direct_client(engine).completions.create(
        model=fleet.model,
        prompt=prompts,
        max_tokens=FILLER_TOKENS - longest,
        extra_body={"ignore_eos": True},
    )
