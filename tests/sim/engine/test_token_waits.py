"""What sampled tokens waited for: the step model's terms, summed once per token."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.engine import Engine, get_profile
from sim.engine.stats import TokenWaits
from tests.support.engine import fresh_prompt, request, run_to_completion

L4 = get_profile("l4-llama3.1-8b")


def test_step_terms_split_the_step_and_are_zero_for_an_empty_one() -> None:
    for prefill, decode, context in ((512, 0, 0), (0, 32, 40_000), (300, 12, 9_000)):
        fixed, prefilling, batch = L4.step_terms(prefill, decode, context)
        assert fixed == L4.fixed_s
        assert prefilling == pytest.approx(L4.prefill_s_per_token * prefill)
        assert batch == pytest.approx(
            L4.decode_s_per_seq * decode + L4.kv_read_s_per_token * context
        )
        assert fixed + prefilling + batch == pytest.approx(
            L4.step_seconds(prefill, decode, context)
        )
    assert L4.step_terms(0, 0, 5_000) == (0.0, 0.0, 0.0)


def test_a_lone_request_waits_one_step_per_token_in_a_batch_of_one(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine()
    engine.add_request(request("r", fresh_prompt(100), 8, ignore_eos=True))
    steps = run_to_completion(engine)
    waits = engine.stats.waits
    assert waits.tokens == engine.stats.generation_tokens == 8
    assert waits.fixed_s == pytest.approx(8 * L4.fixed_s)
    # The first token waited for its prompt's prefill; the other seven for nothing.
    assert waits.prefill_s == pytest.approx(100 * L4.prefill_s_per_token)
    assert waits.token_batch() == 1.0
    total = waits.fixed_s + waits.prefill_s + waits.batch_s
    assert total == pytest.approx(sum(s.duration_s for s in steps))


def test_a_slowed_engine_scales_every_term(make_engine: Callable[..., Engine]) -> None:
    normal, slow = make_engine(), make_engine()
    slow.slowdown = 3.0
    for engine in (normal, slow):
        engine.add_request(request("r", list(range(1, 201)), 4, ignore_eos=True))
        run_to_completion(engine)
    a, b = normal.stats.waits, slow.stats.waits
    assert (b.fixed_s, b.prefill_s, b.batch_s) == pytest.approx(
        (3 * a.fixed_s, 3 * a.prefill_s, 3 * a.batch_s)
    )


def test_replicas_merge_into_the_fleet_s_waits() -> None:
    # One replica runs three requests, the other one: three of every four tokens
    # waited in the batch of three.
    full, light, fleet = TokenWaits(), TokenWaits(), TokenWaits()
    full.add_step((0.03, 0.0, 0.003), batch=3, tokens=3)
    light.add_step((0.03, 0.002, 0.001), batch=1, tokens=1)
    fleet.merge(full)
    fleet.merge(light)
    assert fleet.tokens == 4
    assert fleet.token_batch() == 2.5
    assert fleet.fixed_s == pytest.approx(4 * 0.03)
    assert fleet.prefill_s == pytest.approx(0.002)
    assert fleet.batch_s == pytest.approx(3 * 0.003 + 0.001)


def test_no_tokens_means_no_batch() -> None:
    assert TokenWaits().token_batch() == 0.0
