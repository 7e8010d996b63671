"""A step-driven emulation of vLLM V1's engine core: scheduler + KV cache + timing.

Nothing here does I/O or sleeps.  ``step()`` schedules one batch, "runs" it by
advancing the engine's modeled clock by the profile's step time, and returns
what happened; an async driver sleeps that long (times a time scale) and a
discrete-event simulator just jumps its clock.

Scheduling follows vLLM V1's ``Scheduler.schedule`` with the FCFS policy
(``schedule_policy="lpm"`` orders the waiting queue as SGLang's default does
instead, and ``"priority"`` as vLLM's ``--scheduling-policy priority``, which also
picks whom to preempt: ``sim.engine.schedule_policy``):

1. Running requests first, in admission order.  Each gets the tokens it still
   needs (one to decode, or the rest of its prompt), capped by the remaining
   ``max_num_batched_tokens`` budget, which is what chunks a long prefill over
   several steps.  When its next block cannot be allocated, the *newest*
   running request is preempted by recompute: its blocks are freed and it goes
   back to the front of the waiting queue with no computed tokens (its
   generated tokens are kept and recomputed later, mostly from the cache).
   Under ``priority`` the one preempted is the running request with the highest
   (priority, arrival time); if this step had scheduled it already, it leaves the
   batch and its tokens go back to the step's budget.
2. Then, only if nothing was preempted this step, waiting requests are
   admitted first-come-first-served while ``max_num_seqs`` and the token budget
   allow and their blocks can be allocated.  A request's cached prefix is the
   longest run of its leading block hashes found in the cache; the request
   that cannot get blocks blocks the queue behind it (head-of-line, as vLLM).
3. Every scheduled request whose tokens are now all computed samples one token
   (or takes the next of the tokens it must emit: structured output); a pooling
   request (embeddings) finishes there instead, as vLLM's pooling runner does.

When a prompt is fully cached, the last block is still recomputed (the
lookup is capped at ``num_tokens - 1`` tokens), because the model must run on
at least one token to produce logits; vLLM does the same.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from core.block_identity import VLLM_DEFAULT_SEED, HashAlgo, VllmHashSpec
from core.blocks import BLOCK_SIZE
from sim.engine.block_pool import BlockPool
from sim.engine.events import KVEventBuffer
from sim.engine.profiles import get_profile
from sim.engine.request import EngineRequest, FinishReason, OutputLengthModel, RequestStatus
from sim.engine.schedule_policy import (
    SchedulePolicy,
    longest_prefix_first,
    priority_key,
    shared_prefix_block,
)
from sim.engine.stats import EngineStats
from sim.engine.vocab import Vocabulary


@dataclass(frozen=True)
class EngineConfig:
    """vLLM's knobs that shape scheduling, plus the emulation's own."""

    num_blocks: int = 2048
    block_size: int = BLOCK_SIZE
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 8192
    max_loras: int = 4
    enable_prefix_caching: bool = True
    # vLLM's --prefix-caching-hash-algo and PYTHONHASHSEED (its NONE_HASH seed).
    hash_algo: HashAlgo = HashAlgo.SHA256
    hash_seed: str = VLLM_DEFAULT_SEED
    profile: str = "l4-llama3.1-8b"
    seed: int = 0
    output_lengths: OutputLengthModel = field(default_factory=OutputLengthModel)
    event_buffer_size: int = 10_000
    # The order of the waiting queue: vLLM's FCFS or priority, or SGLang's longest
    # prefix match.
    schedule_policy: SchedulePolicy = SchedulePolicy.FCFS

    @property
    def hash_spec(self) -> VllmHashSpec:
        return VllmHashSpec(self.hash_algo, self.hash_seed)

    @classmethod
    def for_profile(
        cls,
        profile: str,
        *,
        kv_tokens: int | None = None,
        kv_blocks: int | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        **rest: Any,
    ) -> EngineConfig:
        """An engine shaped as ``profile`` sizes it; each given knob overrides the profile's.

        ``kv_blocks`` (vLLM's ``num_gpu_blocks``) wins over ``kv_tokens``; tokens are
        rounded down to whole blocks.  ValueError names a bad value or profile."""
        shape = get_profile(profile)
        block_size = int(rest.get("block_size", BLOCK_SIZE))
        if kv_blocks is None:
            kv_blocks = (shape.kv_tokens if kv_tokens is None else kv_tokens) // block_size
        config = cls(
            profile=profile,
            num_blocks=kv_blocks,
            max_model_len=shape.max_model_len if max_model_len is None else max_model_len,
            max_num_seqs=shape.max_num_seqs if max_num_seqs is None else max_num_seqs,
            max_num_batched_tokens=(
                shape.max_num_batched_tokens
                if max_num_batched_tokens is None
                else max_num_batched_tokens
            ),
            **rest,
        )
        for name in ("num_blocks", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(config, name) < 1:
                raise ValueError(f"{name} must be at least 1 (a KV cache of whole blocks)")
        return config


@dataclass(frozen=True)
class RequestOutput:
    """What one request got from a step (or from an abort)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class StepResult:
    outputs: list[RequestOutput]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    duration_s: float
    clock: float
    # Requests this step scheduled for the first time (vLLM's ``scheduled_new_reqs``):
    # when each looked its prefix up, which is when its ``cached_tokens`` were decided.
    first_scheduled: tuple[str, ...] = ()


class Engine:
    """Requests in, tokens out, one modeled forward pass per ``step()``."""

    def __init__(self, config: EngineConfig, vocab: Vocabulary) -> None:
        self.config = config
        self.vocab = vocab
        self.profile = get_profile(config.profile)
        self.events = KVEventBuffer(config.event_buffer_size)
        self.pool = BlockPool(
            config.num_blocks,
            config.block_size,
            self.events,
            enable_caching=config.enable_prefix_caching,
        )
        # A sequence longer than the whole cache could never be scheduled.
        self.max_model_len = min(config.max_model_len, config.num_blocks * config.block_size)
        self.requests: dict[str, EngineRequest] = {}
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.stats = EngineStats()
        self.clock = 0.0
        self.slowdown = 1.0
        self._first_scheduled: list[str] = []

    # -- state -------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def lora_adapters(self) -> tuple[set[str], set[str]]:
        """Adapters of running and of waiting requests (vLLM's ``lora_requests_info``)."""
        running = {r.lora_name for r in self.running if r.lora_name}
        waiting = {r.lora_name for r in self.waiting if r.lora_name}
        return running, waiting

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def advance_clock(self, now: float) -> None:
        """Move the modeled clock forward to ``now`` (idle time passes too)."""
        self.clock = max(self.clock, now)

    # -- requests ----------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; ValueError if it can never fit (the API answers 400)."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not request.prompt_token_ids:
            raise ValueError("the prompt must contain at least one token")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if request.num_prompt_tokens + request.max_tokens > self.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.max_model_len} tokens. "
                f"However, you requested {request.num_prompt_tokens + request.max_tokens} "
                f"tokens ({request.num_prompt_tokens} in the messages, "
                f"{request.max_tokens} in the completion)."
            )
        cfg = self.config
        request.start(self.clock, cfg.hash_spec, cfg.block_size)
        request.rng = cfg.output_lengths.rng_for(request.prompt_token_ids, request.seed, cfg.seed)
        sampled = cfg.output_lengths.sample(request.rng)
        if request.output_token_ids is not None:
            # Forced output ends where it ends, or at max_tokens (then "length", as in vLLM).
            sampled = len(request.output_token_ids)
        request.target_output_len = (
            request.max_tokens if request.ignore_eos else min(sampled, request.max_tokens)
        )
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Drop a request wherever it is; its blocks go back to the pool."""
        request = self.requests.get(request_id)
        if request is None:
            return None
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        return self._finish(request, FinishReason.ABORT, [])

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- the step ----------------------------------------------------------
    def step(self) -> StepResult:
        """Schedule one batch, advance the clock by its modeled time, emit tokens."""
        budget = self.config.max_num_batched_tokens
        self._first_scheduled = []
        scheduled, budget, preempted = self._schedule_running(budget)
        if not preempted:
            scheduled += self._schedule_waiting(budget)
        prefill, decode, context = self._execute(scheduled)
        seconds, terms = self.profile.step(prefill, decode, context)
        duration = seconds * self.slowdown
        self.clock += duration
        outputs = [out for req, _ in scheduled if (out := self._sample(req)) is not None]
        if scheduled:
            self.stats.steps += 1
            self.stats.busy_seconds += duration
            sampled = sum(1 for out in outputs if out.new_token_ids)  # not a pooling answer
            self.stats.waits.add_step(terms, len(scheduled), sampled, self.slowdown)
        return StepResult(
            outputs, prefill, decode, preempted, duration, self.clock, tuple(self._first_scheduled)
        )

    def _schedule_running(self, budget: int) -> tuple[list[tuple[EngineRequest, int]], int, int]:
        scheduled: list[tuple[EngineRequest, int]] = []
        preempted = 0
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            while not self._allocate(request, num_new, []):
                position = self._preemption_victim()
                victim = self.running.pop(position)
                if position < index:
                    # Scheduled earlier in this step: its tokens go back to the budget.
                    index -= 1
                    budget += self._unschedule(scheduled, victim)
                self._preempt(victim)
                preempted += 1
                if victim is request:
                    return scheduled, budget, preempted
            self._cache_blocks(request, request.num_computed_tokens + num_new)
            scheduled.append((request, num_new))
            budget -= num_new
            index += 1
        return scheduled, budget, preempted

    def _preemption_victim(self) -> int:
        """Where in ``running`` the request to preempt is: the newest (vLLM's FCFS), or
        under ``priority`` the one with the highest (priority, arrival time)."""
        last = len(self.running) - 1
        if self.config.schedule_policy is not SchedulePolicy.PRIORITY:
            return last
        keys = [priority_key(r.priority, r.arrival_time) for r in self.running]
        return max(range(last + 1), key=keys.__getitem__)

    @staticmethod
    def _unschedule(scheduled: list[tuple[EngineRequest, int]], victim: EngineRequest) -> int:
        """Take ``victim`` out of this step's batch; the tokens it had been given."""
        for position, (request, num_new) in enumerate(scheduled):
            if request is victim:
                del scheduled[position]
                return num_new
        return 0

    def _schedule_waiting(self, budget: int) -> list[tuple[EngineRequest, int]]:
        scheduled: list[tuple[EngineRequest, int]] = []
        skipped: list[EngineRequest] = []
        loras = {r.lora_name for r in self.running if r.lora_name}
        if len(self.waiting) > 1:
            if self.config.schedule_policy is SchedulePolicy.LPM:
                self._order_by_longest_prefix()
            elif self.config.schedule_policy is SchedulePolicy.PRIORITY:
                # vLLM keeps a heap; a stable sort of the deque gives the same order.
                self.waiting = deque(
                    sorted(self.waiting, key=lambda r: priority_key(r.priority, r.arrival_time))
                )
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            if self._exceeds_max_loras(request, loras):
                # vLLM skips (not blocks on) a request whose adapter would exceed max_loras.
                skipped.append(self.waiting.popleft())
                continue
            hit_blocks = self._lookup_prefix(request)
            num_computed = len(hit_blocks) * self.config.block_size
            num_new = min(request.num_tokens - num_computed, budget)
            if not self._allocate(request, num_new, hit_blocks):
                break
            self.waiting.popleft()
            self._record_prefix_lookup(request, num_computed)
            request.num_computed_tokens = num_computed
            request.num_cached_blocks = len(hit_blocks)
            # Cached as scheduled, before the step runs, as vLLM's ``allocate_slots``
            # does: a request scheduled after this one, in this step or a later one,
            # finds these blocks (the step writes each layer's KV before any attention
            # reads it).
            self._cache_blocks(request, num_computed + num_new)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            scheduled.append((request, num_new))
            budget -= num_new
            if request.lora_name:
                loras.add(request.lora_name)
        self.waiting.extendleft(reversed(skipped))
        return scheduled

    def _order_by_longest_prefix(self) -> None:
        """SGLang's ``lpm``: the waiting request with the most cached prompt first,
        looked up again before every batch (the cache changed since)."""
        size = self.config.block_size
        leading = shared_prefix_block(size)

        def cached_tokens(request: EngineRequest) -> int:
            return len(self._lookup_prefix(request)) * size

        def leading_key(request: EngineRequest) -> int | None:
            hashes = request.block_hashes
            return hashes[leading] if len(hashes) > leading else None

        self.waiting = deque(longest_prefix_first(self.waiting, cached_tokens, leading_key))

    def _exceeds_max_loras(self, request: EngineRequest, loras: set[str]) -> bool:
        name = request.lora_name
        return bool(name) and name not in loras and len(loras) >= self.config.max_loras

    def _lookup_prefix(self, request: EngineRequest) -> list[int]:
        # Cap at num_tokens - 1 so at least one token is computed (for logits).
        max_blocks = (request.num_tokens - 1) // self.config.block_size
        return self.pool.lookup_prefix(request.block_hashes, max_blocks)

    def _record_prefix_lookup(self, request: EngineRequest, num_cached: int) -> None:
        # Counted once per request, when it is first admitted: a request that
        # waits for blocks is looked up again each step, and a resumed
        # preemption is not a new query (vLLM reports cached tokens the same way).
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_cached
            self._first_scheduled.append(request.request_id)
            self.stats.prefix_cache_queries += request.num_tokens
            self.stats.prefix_cache_hits += num_cached

    def _allocate(self, request: EngineRequest, num_new: int, hit_blocks: list[int]) -> bool:
        """Give ``request`` blocks for ``num_new`` more tokens (after any cache hits)."""
        size = self.config.block_size
        held = len(request.blocks) + len(hit_blocks)
        computed = request.num_computed_tokens + len(hit_blocks) * size
        needed = max(0, math.ceil((computed + num_new) / size) - held)
        if needed + self.pool.num_evictable(hit_blocks) > self.pool.num_free:
            return False
        self.pool.touch(hit_blocks)
        new_blocks = self.pool.allocate(needed)
        assert new_blocks is not None  # guaranteed by the free-count check above
        request.blocks += hit_blocks + new_blocks
        return True

    def _preempt(self, request: EngineRequest) -> None:
        self.pool.free(request.blocks)
        request.blocks = []
        request.num_computed_tokens = 0
        request.num_cached_blocks = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        self.stats.preemptions += 1

    def _execute(self, scheduled: list[tuple[EngineRequest, int]]) -> tuple[int, int, int]:
        """Mark the batch computed (its full blocks were cached as it was scheduled);
        return token counts."""
        prefill = decode = context = 0
        for request, num_new in scheduled:
            is_decode = num_new == 1 and request.num_computed_tokens >= request.num_prompt_tokens
            if is_decode:
                decode += 1
            else:
                prefill += num_new
            context += request.num_computed_tokens
            request.num_computed_tokens += num_new
        return prefill, decode, context

    def _cache_blocks(self, request: EngineRequest, num_tokens: int) -> None:
        """Cache ``request``'s full blocks among its first ``num_tokens`` tokens."""
        full = min(num_tokens // self.config.block_size, len(request.block_hashes))
        start = request.num_cached_blocks
        if full <= start:
            return
        parent = request.block_hashes[start - 1] if start else None
        self.pool.cache_full_blocks(
            request.blocks,
            request.block_hashes,
            start,
            full,
            request.token_ids,
            parent,
            request.lora_id,
            request.lora_name,
        )
        request.num_cached_blocks = full

    def _sample(self, request: EngineRequest) -> RequestOutput | None:
        """Sample a token for a request whose tokens are all computed (not mid-prefill)."""
        if request.num_computed_tokens < request.num_tokens:
            return None
        if request.pooling:
            self.running.remove(request)
            self.stats.prompt_tokens += request.num_prompt_tokens
            return self._finish(request, FinishReason.STOP, [])
        token = self._next_token(request)
        cfg = self.config
        request.append_token(token, cfg.hash_spec, cfg.block_size)
        self.stats.generation_tokens += 1
        if request.first_token_time is None:
            request.first_token_time = self.clock
            self.stats.ttft.observe(self.clock - request.arrival_time)
            self.stats.prompt_tokens += request.num_prompt_tokens
        reason = request.finish_reason_after_token(self.max_model_len)
        if reason is None:
            return self._output(request, [token], None)
        self.running.remove(request)
        return self._finish(request, reason, [token])

    def _next_token(self, request: EngineRequest) -> int:
        forced = request.output_token_ids
        if forced is not None and request.num_output_tokens < len(forced):
            return forced[request.num_output_tokens]
        assert request.rng is not None
        return self.vocab.token_ids[request.rng.randrange(len(self.vocab))]

    def _finish(
        self, request: EngineRequest, reason: FinishReason, new_tokens: list[int]
    ) -> RequestOutput:
        self.pool.free(request.blocks)
        request.blocks = []
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        del self.requests[request.request_id]
        self.stats.finished[reason.value] += 1
        if reason is not FinishReason.ABORT:
            self.stats.e2e.observe(self.clock - request.arrival_time)
        return self._output(request, new_tokens, reason)

    @staticmethod
    def _output(
        request: EngineRequest, new_tokens: list[int], reason: FinishReason | None
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=new_tokens,
            finish_reason=reason,
            prompt_tokens=request.num_prompt_tokens,
            completion_tokens=request.num_output_tokens,
            cached_tokens=max(0, request.num_cached_tokens),
        )
