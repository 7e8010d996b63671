"""Block identity: which integer names a full KV block of a model, and how it is known.

The cache map is keyed by block keys; a request's keys (``describe``) and the keys
KV events report must be the same integers, or ``cache_map`` never sees a hit.  A
*block scheme* fixes that per model: the block size (the engine's, read from
``vllm:cache_config_info``; 16 until known) and one of two modes, chosen per service
(``policy_params["block_identity"]``):

``token_ids`` (the default)
    Meridian keeps its own key chain (``core.blocks``: blake2b over
    ``block_size``-token blocks and the LoRA name) on both sides: requests are keyed
    directly, and each ``BlockStored`` event is re-keyed from its ``token_ids`` and
    ``parent_block_hash`` (``core.event_keys``).  Nothing about the engine's
    hash has to be known, so it keeps working across engine versions, hash
    algorithms (``--prefix-caching-hash-algo``), seeds (``PYTHONHASHSEED``) and
    engines that publish their own hash; the cost is a bounded per-replica map from
    engine hash to key, and an event chained to a block Meridian never saw (an
    orphan) cannot be keyed until a resync.

``vllm``
    Meridian computes vLLM's own hash (``vllm/v1/core/kv_cache_utils.py``):
    ``NONE_HASH = H(seed)`` with ``seed`` = the engine's ``PYTHONHASHSEED``, else
    ``"vllm-none-hash"``; block ``i`` is ``H((parent_digest, tuple(token_ids),
    extra_keys))`` chained from ``NONE_HASH``, where ``H`` is sha256 over
    ``pickle.dumps(..., protocol=HIGHEST_PROTOCOL)`` (``sha256``, vLLM's default)
    or over ``cbor2.dumps(..., canonical=True)`` (``sha256_cbor``), and
    ``extra_keys`` is None or ``(("lora", name, path),)`` for a LoRA request.
    Events carry the low 64 bits of each digest as an int, so request keys equal
    the engine's and no map is needed; but a wrong seed, algorithm or LoRA path
    gives zero matches (which the hit-rate mismatch detector is there to catch).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import cbor2

from core.blocks import BLOCK_SIZE, DEFAULT_SEED, block_hashes

BLOCK_IDENTITY_KEY = "block_identity"  # policy_params key
VLLM_DEFAULT_SEED = "vllm-none-hash"  # vLLM's DEFAULT_NONE_HASH_SEED
_LOW_64 = (1 << 64) - 1
_Choice = TypeVar("_Choice", bound=StrEnum)


class BlockIdentityMode(StrEnum):
    TOKEN_IDS = "token_ids"
    VLLM = "vllm"


class HashAlgo(StrEnum):
    """vLLM's ``--prefix-caching-hash-algo`` values Meridian can reproduce."""

    SHA256 = "sha256"
    SHA256_CBOR = "sha256_cbor"


class BlockSizeSource(StrEnum):
    DEFAULT = "default"
    CONFIGURED = "configured"
    ENGINE = "engine"  # vllm:cache_config_info


# -- vLLM's hash, as its source writes it --------------------------------------------


def _sha256_pickle(value: object) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


_HASH_FUNCTIONS = {HashAlgo.SHA256: _sha256_pickle, HashAlgo.SHA256_CBOR: _sha256_cbor}


def external_hash(digest: bytes) -> int:
    """The int a vLLM event carries for a block digest (``maybe_convert_block_hash``)."""
    return int.from_bytes(digest, "big") & _LOW_64


def lora_extra_keys(name: str, path: str) -> tuple[tuple[str, str, str], ...] | None:
    """vLLM's extra keys of a block of a LoRA request (name and path), None without one."""
    return (("lora", name, path),) if name else None


@dataclass(frozen=True, slots=True)
class VllmHashSpec:
    """vLLM's block hash: algorithm and none-hash seed (the engine's PYTHONHASHSEED)."""

    algo: HashAlgo = HashAlgo.SHA256
    seed: str = VLLM_DEFAULT_SEED

    def none_hash(self) -> bytes:
        return _HASH_FUNCTIONS[self.algo](self.seed)

    def digests(
        self,
        tokens: Sequence[int],
        block_size: int,
        extra_keys: tuple[Any, ...] | None = None,
        parent: bytes | None = None,
    ) -> list[bytes]:
        """The full digest of every full block of ``tokens``, chained from ``parent``
        (the digest of the block before the first; None: the sequence's start)."""
        hash_fn = _HASH_FUNCTIONS[self.algo]
        previous = parent or self.none_hash()
        digests: list[bytes] = []
        for start in range(0, len(tokens) - block_size + 1, block_size):
            block = tuple(int(t) for t in tokens[start : start + block_size])
            previous = hash_fn((previous, block, extra_keys))
            digests.append(previous)
        return digests


# -- one model's scheme --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockScheme:
    """How one model's request blocks are keyed; the same object keys its events."""

    mode: BlockIdentityMode = BlockIdentityMode.TOKEN_IDS
    block_size: int = BLOCK_SIZE
    meridian_seed: str = DEFAULT_SEED  # token_ids mode: the root of Meridian's chain
    vllm: VllmHashSpec = field(default_factory=VllmHashSpec)
    # vllm mode: adapter name -> the path vLLM loaded it from (part of its hash); an
    # adapter without one hashes with its name as its path, as the emulated replica does.
    lora_paths: Mapping[str, str] = field(default_factory=dict)

    def keys(self, tokens: Sequence[int], extra: str = "") -> list[int]:
        """The key of every full block of ``tokens``; ``extra`` is the LoRA adapter name."""
        if self.mode is BlockIdentityMode.VLLM:
            extra_keys = lora_extra_keys(extra, self.lora_paths.get(extra, extra))
            digests = self.vllm.digests(tokens, self.block_size, extra_keys)
            return [external_hash(d) for d in digests]
        return block_hashes(
            tokens, block_size=self.block_size, extra=extra, seed=self.meridian_seed
        )


@dataclass(frozen=True, slots=True)
class BlockIdentityConfig:
    """A service's ``policy_params["block_identity"]``, validated."""

    mode: BlockIdentityMode = BlockIdentityMode.TOKEN_IDS
    hash_algo: HashAlgo | None = None  # None: what the engine reports, else sha256
    hash_seed: str = VLLM_DEFAULT_SEED
    block_size: int | None = None  # None: what the engine reports, else 16
    lora_paths: Mapping[str, str] = field(default_factory=dict)


def parse_block_identity(raw: Any) -> BlockIdentityConfig:
    """``{"mode": ..., "hash_algo": ..., "hash_seed": ..., "block_size": ...,
    "lora_paths": {...}}``, every key optional; ValueError names what is wrong."""
    if raw is None:
        return BlockIdentityConfig()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{BLOCK_IDENTITY_KEY} must be an object, got {raw!r}")
    unknown = set(raw) - {"mode", "hash_algo", "hash_seed", "block_size", "lora_paths"}
    if unknown:
        raise ValueError(f"{BLOCK_IDENTITY_KEY}: unknown keys {sorted(unknown)}")
    return BlockIdentityConfig(
        mode=_choice(BlockIdentityMode, raw.get("mode", BlockIdentityMode.TOKEN_IDS), "mode"),
        hash_algo=_choice(HashAlgo, raw["hash_algo"], "hash_algo") if "hash_algo" in raw else None,
        hash_seed=_string(raw.get("hash_seed", VLLM_DEFAULT_SEED), "hash_seed"),
        block_size=_block_size(raw.get("block_size")),
        lora_paths=_lora_paths(raw.get("lora_paths") or {}),
    )


def _choice(kind: type[_Choice], value: Any, name: str) -> _Choice:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise ValueError(f"{BLOCK_IDENTITY_KEY}.{name} must be one of {allowed}") from None


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{BLOCK_IDENTITY_KEY}.{name} must be a string, got {value!r}")
    return value


def _block_size(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{BLOCK_IDENTITY_KEY}.block_size must be a positive integer")
    return value


def _lora_paths(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{BLOCK_IDENTITY_KEY}.lora_paths must map adapter names to paths")
    return dict(value)


def split_block_identity_params(
    params: Mapping[str, Any],
) -> tuple[BlockIdentityConfig, dict[str, Any]]:
    """Take ``block_identity`` out of ``policy_params`` (it is no policy's parameter)."""
    rest = {k: v for k, v in params.items() if k != BLOCK_IDENTITY_KEY}
    return parse_block_identity(params.get(BLOCK_IDENTITY_KEY)), rest


# -- every model's scheme ------------------------------------------------------------


@dataclass(slots=True)
class _ModelIdentity:
    config: BlockIdentityConfig = field(default_factory=BlockIdentityConfig)
    engine_block_size: int | None = None
    engine_hash_algo: str | None = None


class ModelBlockSchemes:
    """Per model: the service's configured identity and what its engines report.

    Every replica of a model shares one block size, so the latest engine report
    stands for all of them; a configured ``block_size`` overrides the engine's."""

    def __init__(self, meridian_seed: str = DEFAULT_SEED) -> None:
        self.meridian_seed = meridian_seed
        self._models: dict[str, _ModelIdentity] = {}
        self._schemes: dict[str, BlockScheme] = {}

    def configure(self, model: str, config: BlockIdentityConfig) -> None:
        entry = self._models.setdefault(model, _ModelIdentity())
        if entry.config != config:
            entry.config = config
            self._schemes.pop(model, None)

    def observe_engine(
        self, model: str, block_size: int | None, hash_algo: str | None = None
    ) -> None:
        """What a replica's ``vllm:cache_config_info`` says (None: not reported)."""
        entry = self._models.setdefault(model, _ModelIdentity())
        if block_size is not None and block_size != entry.engine_block_size:
            entry.engine_block_size = block_size
            self._schemes.pop(model, None)
        if hash_algo is not None and hash_algo != entry.engine_hash_algo:
            entry.engine_hash_algo = hash_algo
            self._schemes.pop(model, None)

    def scheme(self, model: str) -> BlockScheme:
        """The model's scheme, built once per change (``describe`` asks every request)."""
        scheme = self._schemes.get(model)
        if scheme is None:
            scheme = self._schemes[model] = self._build(self._models.get(model, _ModelIdentity()))
        return scheme

    def _build(self, entry: _ModelIdentity) -> BlockScheme:
        config = entry.config
        size, _ = _block_size_of(entry)
        algo = config.hash_algo or _known_algo(entry.engine_hash_algo) or HashAlgo.SHA256
        return BlockScheme(
            mode=config.mode,
            block_size=size,
            meridian_seed=self.meridian_seed,
            vllm=VllmHashSpec(algo, config.hash_seed),
            lora_paths=config.lora_paths,
        )

    def view(self, model: str) -> dict[str, Any]:
        """For ``/internal/state``: the scheme in use and where its block size came from."""
        entry = self._models.get(model, _ModelIdentity())
        scheme = self.scheme(model)
        _, source = _block_size_of(entry)
        row: dict[str, Any] = {
            "mode": scheme.mode.value,
            "block_size": scheme.block_size,
            "block_size_source": source.value,
        }
        if scheme.mode is BlockIdentityMode.VLLM:
            row["hash_algo"] = scheme.vllm.algo.value
            row["hash_seed_is_default"] = scheme.vllm.seed == VLLM_DEFAULT_SEED
        if entry.engine_hash_algo is not None:
            row["engine_hash_algo"] = entry.engine_hash_algo
        return row


def _block_size_of(entry: _ModelIdentity) -> tuple[int, BlockSizeSource]:
    if entry.config.block_size is not None:
        return entry.config.block_size, BlockSizeSource.CONFIGURED
    if entry.engine_block_size is not None:
        return entry.engine_block_size, BlockSizeSource.ENGINE
    return BLOCK_SIZE, BlockSizeSource.DEFAULT


def _known_algo(name: str | None) -> HashAlgo | None:
    try:
        return HashAlgo(name) if name is not None else None
    except ValueError:
        return None  # xxhash & co: a vllm-mode service must name an algorithm it can use
