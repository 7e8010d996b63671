"""The balancer's view of the real engines' caches: lost events healed from vLLM's replay
endpoint, and the hit-rate mismatch detector, quiet when the view is right (a scripted
multi-turn workload: expected cached tokens within one block of what vLLM reports) and
firing when the hash seed is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings

from ops import http_probe
from tests.engines.conftest import WRONG_SEED_MODEL, WRONG_SEED_SUFFIX
from tests.engines.fleet import (
    EngineFleet,
    balancer_hears,
    cached_tokens,
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
