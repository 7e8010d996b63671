"""Modeled step times: the profiles' calibration points and how steps grow."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from sim.engine import Engine, get_profile
from tests.support.engine import fresh_prompt, request


def test_l4_prefill_of_512_tokens_takes_about_300_ms(make_engine: Callable[..., Engine]) -> None:
    engine = make_engine(profile="l4-llama3.1-8b")
    engine.add_request(request("r", fresh_prompt(512), 2))
    step = engine.step()
    assert step.num_prefill_tokens == 512
    assert step.duration_s == pytest.approx(0.30, abs=0.01)


def decode_step(engine: Engine, batch: int, prompt_len: int) -> float:
    for i in range(batch):
        engine.add_request(request(f"r{i}", fresh_prompt(prompt_len), 50, ignore_eos=True))
    engine.step()  # prefill everything
    step = engine.step()
    assert step.num_decode_tokens == batch and step.num_prefill_tokens == 0
    return step.duration_s


def test_decode_steps_are_tens_of_ms_and_grow_with_batch_and_context(
    make_engine: Callable[..., Engine],
) -> None:
    single = decode_step(make_engine(max_num_batched_tokens=8192), 1, 100)
    batch = decode_step(make_engine(max_num_batched_tokens=8192), 32, 100)
    long_context = decode_step(
        make_engine(max_num_batched_tokens=70_000, num_blocks=8192), 32, 2000
    )
    assert 0.02 < single < 0.05
    assert single < batch < long_context < 0.2


def test_h100_is_faster_and_slowdown_scales_steps(make_engine: Callable[..., Engine]) -> None:
    h100 = make_engine(profile="h100-llama3.1-8b")
    h100.add_request(request("r", fresh_prompt(512), 2))
    assert h100.step().duration_s < 0.1 * 0.30 * 1.2

    slow = make_engine()
    slow.slowdown = 4.0
    slow.add_request(request("r", fresh_prompt(512), 2))
    assert slow.step().duration_s == pytest.approx(
        4 * get_profile("l4-llama3.1-8b").step_seconds(512, 0, 0)
    )


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"l4-llama3\.1-8b"):
        get_profile("tpu-v9")
