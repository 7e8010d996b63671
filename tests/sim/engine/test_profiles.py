"""Engine regimes: each profile's KV/context shape, and the flags that override it."""

from __future__ import annotations

import pytest

from core.tokenizer import build_tokenizer
from sim.engine import Engine, EngineConfig, EngineRequest, Vocabulary
from sim.engine.profiles import (
    GIB,
    LLAMA31_8B_BF16_WEIGHT_BYTES,
    LLAMA31_8B_KV_BYTES_PER_TOKEN,
    PROFILES,
    kv_tokens_from_memory,
)


def test_llama_kv_bytes_per_token_is_k_and_v_over_every_layer_and_head() -> None:
    assert LLAMA31_8B_KV_BYTES_PER_TOKEN == 128 * 1024  # 2 * 32 * 8 * 128 * 2


def test_h100_capacity_is_what_memory_leaves_after_weights_and_reserve() -> None:
    # 80 GiB * 0.9 = 77,309,411,328; minus 16.06e9 weights and 4 GiB: 56,954,444,032 bytes.
    expected = 56_954_444_032 // (128 * 1024)
    assert expected == 434_527
    assert PROFILES["h100-llama3.1-8b"].kv_tokens == expected
    assert PROFILES["h100-llama3.1-8b"].max_model_len == 128 * 1024


def test_memory_too_small_for_the_weights_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        kv_tokens_from_memory(
            gpu_bytes=16 * GIB,
            weight_bytes=LLAMA31_8B_BF16_WEIGHT_BYTES,
            kv_bytes_per_token=LLAMA31_8B_KV_BYTES_PER_TOKEN,
        )


def test_for_profile_takes_the_profiles_shape() -> None:
    h100 = EngineConfig.for_profile("h100-llama3.1-8b")
    assert h100.num_blocks == 434_527 // 16
    assert (h100.max_model_len, h100.max_num_seqs, h100.max_num_batched_tokens) == (
        131_072,
        1024,
        8192,
    )
    small = EngineConfig.for_profile("l4-llama3.1-8b-small-kv")
    assert small.num_blocks * small.block_size == 8192 < EngineConfig().num_blocks * 16
    # The default profile's shape is the engine's long-standing default.
    default = EngineConfig.for_profile("l4-llama3.1-8b")
    assert default == EngineConfig()


def test_flags_override_the_profile_blocks_winning_over_tokens() -> None:
    config = EngineConfig.for_profile("l4-llama3.1-8b", kv_tokens=1000, max_model_len=512)
    assert (config.num_blocks, config.max_model_len) == (62, 512)  # 1000 // 16
    assert EngineConfig.for_profile("l4-llama3.1-8b", kv_tokens=1000, kv_blocks=7).num_blocks == 7
    with pytest.raises(ValueError, match="num_blocks"):
        EngineConfig.for_profile("l4-llama3.1-8b", kv_tokens=8)
    with pytest.raises(ValueError, match="unknown step-time profile"):
        EngineConfig.for_profile("a100-nothing")


def test_a_long_prompt_fits_the_modern_profile_and_not_the_l4_one() -> None:
    vocab = Vocabulary(build_tokenizer(None))
    prompt = list(range(3, 3 + 15_000))  # the Mooncake trace's mean input
    l4 = Engine(EngineConfig.for_profile("l4-llama3.1-8b"), vocab)
    with pytest.raises(ValueError, match="maximum context length is 8192"):
        l4.add_request(EngineRequest("a", prompt, 16))
    h100 = Engine(EngineConfig.for_profile("h100-llama3.1-8b"), vocab)
    h100.add_request(EngineRequest("a", prompt, 16))
    assert h100.num_waiting == 1
