"""One request's state inside the engine, and its deterministic output length.

A request's tokens are its prompt followed by what it has generated so far;
``num_computed_tokens`` says how many of them already have KV in the cache.
The scheduler's only question each step is "how many of the remaining tokens
do I compute now": the whole rest of the prompt (prefill), a chunk of it
(chunked prefill) or the one token sampled last step (decode), exactly as in
vLLM V1, where prefill and decode are not separate phases.

Block hashes are vLLM's own (``core.block_identity.VllmHashSpec``: sha256
of the parent's digest, the block's tokens and the LoRA extra keys), extended as
tokens arrive so generated tokens are cacheable too (a follow-up turn can hit
them).  The cache and the KV events use each digest's low 64 bits, the int form
vLLM's events carry; the full digests chain the next block.
"""

from __future__ import annotations

import enum
import math
import random
import zlib
from array import array
from dataclasses import dataclass, field

from core.block_identity import VllmHashSpec, external_hash, lora_extra_keys


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(frozen=True)
class OutputLengthModel:
    """Log-normal output lengths, the usual fit for chat traces (median ~ 200 tokens).

    Deterministic: the same prompt with the same seed always yields the same
    length, so benchmarks repeat and a length predictor has something to learn.
    """

    median: float = 180.0
    sigma: float = 0.8

    def rng_for(
        self, prompt_token_ids: list[int], seed: int | None, engine_seed: int
    ) -> random.Random:
        digest = zlib.crc32(array("I", prompt_token_ids).tobytes())
        return random.Random(f"{engine_seed}:{seed}:{digest}:{len(prompt_token_ids)}")

    def sample(self, rng: random.Random) -> int:
        return max(1, round(rng.lognormvariate(math.log(self.median), self.sigma)))


@dataclass(eq=False)
class EngineRequest:
    """What the engine needs of a request; the caller fills the first fields only."""

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = False
    seed: int | None = None
    lora_name: str = ""  # a LoRA adapter: part of every block hash, as in vLLM
    lora_id: int | None = None
    lora_path: str = ""  # where vLLM would load the adapter from (default: its name)
    # The tokens to generate, in order, instead of sampling: structured output, whose
    # text the replica decided up front as vLLM's guided decoding grammar would force.
    output_token_ids: list[int] | None = None
    # A pooling request (embeddings): prefill only, finished without sampling a token.
    pooling: bool = False
    # vLLM's ``priority`` (lower is served sooner) for an engine that schedules by it
    # (``SchedulePolicy.PRIORITY``); any other engine ignores it, as vLLM 0.32 does.
    priority: int = 0

    status: RequestStatus = RequestStatus.WAITING
    token_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    block_digests: list[bytes] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_blocks: int = 0
    num_cached_tokens: int = -1
    target_output_len: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finish_reason: FinishReason | None = None
    rng: random.Random | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def extra_keys(self) -> tuple[tuple[str, str, str], ...] | None:
        return lora_extra_keys(self.lora_name, self.lora_path or self.lora_name)

    def start(self, arrival_time: float, spec: VllmHashSpec, block_size: int) -> None:
        """Reset the mutable state and hash the prompt's full blocks."""
        self.token_ids = list(self.prompt_token_ids)
        self.block_digests = spec.digests(self.token_ids, block_size, self.extra_keys)
        self.block_hashes = [external_hash(d) for d in self.block_digests]
        self.arrival_time = arrival_time

    def append_token(self, token_id: int, spec: VllmHashSpec, block_size: int) -> None:
        """Append a generated token; hash the block it completes, if any."""
        self.token_ids.append(token_id)
        if len(self.token_ids) % block_size == 0:
            parent = self.block_digests[-1] if self.block_digests else None
            block = self.token_ids[-block_size:]
            (digest,) = spec.digests(block, block_size, self.extra_keys, parent)
            self.block_digests.append(digest)
            self.block_hashes.append(external_hash(digest))

    def finish_reason_after_token(self, max_model_len: int) -> FinishReason | None:
        """Why the request is done after its latest token, or None to keep going."""
        if self.num_output_tokens >= self.target_output_len:
            hit_cap = self.target_output_len >= self.max_tokens
            return FinishReason.LENGTH if hit_cap else FinishReason.STOP
        if self.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        return None
