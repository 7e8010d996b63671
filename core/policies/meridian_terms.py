"""The cost model's settings, what it knows of each replica, and one replica's terms.

``core.policies.meridian`` documents every term and where its numbers come
from; this module holds the per-replica state those terms read (a replica's
learned rates, the ledger of what this balancer sent it, its probed KV usage) and
the arithmetic of one replica's price, shared by the policy and by the walk over
cold replicas (``core.policies.meridian_book``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.types import RTT_KEY, TargetState

# The engines' waiting orders the cost model knows (``MeridianConfig.engine_queue``).
ENGINE_QUEUES = ("fcfs", "lpm", "priority")


# vLLM's request priorities (lower is served sooner) for engines that schedule by
# priority: every request's (0, vLLM's default too), and a cold copy's into a cache
# with no room for it, which yields to the turns whose history the cache holds.
DEFAULT_PRIORITY = 0
COLD_COPY_PRIORITY = 1


@dataclass(frozen=True, slots=True)
class MeridianConfig:
    # Engine-profile defaults (l4-llama3.1-8b), refined online per replica.
    prefill_s_per_token: float = 0.53e-3
    itl_s: float = 0.035
    step_s: float = 0.030
    # What one more running sequence adds to a decode step (its GEMM share and
    # the attention reads of ~1k tokens of context).
    seq_s: float = 0.75e-3
    # Weight of the decode terms (a request's own decode steps and their slowdown
    # of the running ones) against the time to first token; 0 prices TTFT only.
    decode_weight: float = 1.0
    local_rtt_s: float = 0.001
    # SP-P's rule in tokens: queued prefill a replica may hold and still admit.
    # 0: what the engine prefills in ``wait_limit_s`` at ``prefill_s_per_token``
    # (``admission_limit``; 472 tokens at these defaults).
    admission_tokens: int = 0
    # How the engines order their waiting requests: "fcfs" (vLLM), "lpm" (SGLang's
    # longest prefix match) or "priority" (vLLM's --scheduling-policy priority).  Under
    # "lpm" a held-back replica admits the requests whose prefix it caches: its engine
    # serves them ahead of colder ones.  Under "priority" each request sent to a
    # replica carries a priority: ``COLD_COPY_PRIORITY`` where that replica caches no
    # more than ``affinity_tokens`` of the prompt and its KV look-ahead has no room
    # for it, else ``DEFAULT_PRIORITY``.
    engine_queue: str = "fcfs"
    # Sequences an engine runs at once (vLLM's ``max_num_seqs``, SGLang's
    # ``max_running_requests``): past it a new request waits for a slot.
    max_num_seqs: int = 256
    # PreServe look-ahead: KV capacity and how many decode tokens ahead to count.
    kv_capacity_tokens: int = 32_768
    lookahead_tokens: int = 256
    default_output_tokens: int = 256
    harm_weight: float = 1.0
    block_tokens: int = 16
    max_blocks_per_target: int = 2048
    # Keep the radix tree by the engines' KV events where they publish them: a removed
    # block cuts its engine's hold (``RadixTree.release``).  A replica's bound then
    # only caps memory, at twice ``max_blocks_per_target``, from its first event on;
    # one whose engine is silent keeps the tree's own guess.
    tree_from_kv_events: bool = False
    ewma_alpha: float = 0.2
    min_sample_tokens: int = 64
    # Waiting stays an option only this long, so it never becomes a timeout.
    wait_limit_s: float = 0.25
    # Prefix affinity: a replica lacking more than this many tokens of what the best
    # local holder caches is reached only by waiting (until wait_limit_s).
    affinity_tokens: int = 256
    # Past wait_limit_s, a replica lacking the prefix takes the request only if the
    # copy is at most this share of a replica's KV cache: a larger copy pins that
    # share for the program's later requests, which follow it there.
    max_copy_share: float = 0.25
    # The region's prefix digest for peers (core.prefix_digest): every
    # ``digest_min_stride``-th block of what its replicas hold, the stride doubled
    # until it fits ``digest_max_hashes`` (8 bytes each in the heartbeat).
    digest_min_stride: int = 4
    digest_max_hashes: int = 4096
    # Weight of what a copy into a peer's caches displaces there (``reuse`` x the
    # tokens it copies x the peer's prefill price); 0 leaves it unpriced.
    displace_weight: float = 1.0
    # The time to first token the service is held to (its SLO).  Where a peer is an
    # option, an option whose own wait for its first token passes it is priced one
    # request lifetime more (``miss`` in the policy's docstring); 0 prices no miss.
    ttft_slo_s: float = 2.0

    def admission_limit(self) -> int:
        """Queued prefill tokens under which a replica admits: ``admission_tokens``,
        or what the engine prefills in ``wait_limit_s``, so an admitted request waits
        in an engine's queue about as long as one may wait in the balancer's before
        the limit is waived.  At least 1: an engine with nothing queued admits."""
        if self.admission_tokens:
            return self.admission_tokens
        return max(1, round(self.wait_limit_s / self.prefill_s_per_token))

    def __post_init__(self) -> None:
        positive = {
            "prefill_s_per_token": self.prefill_s_per_token,
            "itl_s": self.itl_s,
            "seq_s": self.seq_s,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "block_tokens": self.block_tokens,
            "max_blocks_per_target": self.max_blocks_per_target,
            "default_output_tokens": self.default_output_tokens,
            "digest_min_stride": self.digest_min_stride,
            "digest_max_hashes": self.digest_max_hashes,
            "max_num_seqs": self.max_num_seqs,
        }
        for key, value in positive.items():
            if value <= 0:
                raise ValueError(f"{key} must be positive")
        if min(self.step_s, self.local_rtt_s, self.harm_weight, self.wait_limit_s) < 0:
            raise ValueError("step_s, local_rtt_s, harm_weight and wait_limit_s must be >= 0")
        if min(self.decode_weight, self.displace_weight, self.ttft_slo_s) < 0:
            raise ValueError("decode_weight, displace_weight and ttft_slo_s must be >= 0")
        if min(self.lookahead_tokens, self.min_sample_tokens, self.affinity_tokens) < 0:
            raise ValueError("lookahead_tokens, min_sample_tokens and affinity_tokens must be >= 0")
        if self.admission_tokens < 0:
            raise ValueError("admission_tokens must be >= 0 (0: derived from wait_limit_s)")
        if not 0.0 < self.ewma_alpha <= 1.0:
            raise ValueError("ewma_alpha must be within (0, 1]")
        if self.engine_queue not in ENGINE_QUEUES:
            raise ValueError(f"engine_queue must be one of {', '.join(ENGINE_QUEUES)}")
        if not 0.0 < self.max_copy_share <= 1.0:
            raise ValueError("max_copy_share must be within (0, 1]")


@dataclass(slots=True)
class InFlight:
    """One request this balancer sent to a replica, as the cost model counts it."""

    uncached: int
    kv_tokens: int
    queued_ahead: int
    prefilled: bool = False
    # Its prompt's block hashes, kept only where the tree follows KV events: until its
    # first token the engine has not stored them, so no eviction reported meanwhile
    # (of an older copy) may cut them from the tree.
    blocks: Sequence[int] = ()


@dataclass(slots=True)
class ReplicaModel:
    """What the cost model knows of one replica: learned rates, its ledger and its
    probed KV usage."""

    prefill_s_per_token: float
    itl_s: float
    mean_output: float
    # The round trip to it when this balancer last sent it a request (``rtt_s``).
    rtt_s: float = 0.0
    queued_prefill: int = 0
    kv_tokens: int = 0
    decoding: int = 0
    # The latest probe's KV usage (0..1), as observe_probe reported it.
    kv_usage: float = 0.0
    inflight: dict[str, InFlight] = field(default_factory=dict)


def rtt_s(config: MeridianConfig, target: TargetState) -> float:
    """The round trip to ``target`` from here, at least ``local_rtt_s``."""
    return max(config.local_rtt_s, target.extra.get(RTT_KEY, 0.0) / 1000.0)


def replica_cost(config: MeridianConfig, model: ReplicaModel, uncached: int, decode: int) -> float:
    """``ttft + slot + harm + pressure`` of ``uncached`` prompt tokens and ``decode``
    look-ahead decode tokens on the replica ``model`` describes."""
    rate = model.prefill_s_per_token
    ttft = model.rtt_s + config.step_s + model.queued_prefill * rate + uncached * rate
    ttft += slot_wait_s(config, model)
    harm = harm_s(config, uncached, model.decoding)
    # The KV it adds there: its uncached prompt and its look-ahead decode (the
    # cached prefix is held already, once for every request sharing it).
    return ttft + harm + pressure_s(config, model, uncached + decode)


def own_wait_s(
    config: MeridianConfig, model: ReplicaModel, uncached: int, decode: int, ahead_tokens: float
) -> float:
    """The request's own wait for its first token on the replica ``model`` describes:
    ``replica_cost`` less the harm, with ``ahead_tokens`` more prefill queued before
    it (what waits ahead of it in the balancer's queue).  What the SLO is about."""
    rate = model.prefill_s_per_token
    queued = model.queued_prefill + ahead_tokens + uncached
    wait = model.rtt_s + config.step_s + queued * rate + slot_wait_s(config, model)
    return wait + pressure_s(config, model, uncached + decode)


def harm_s(config: MeridianConfig, uncached: int, decoding: float) -> float:
    """The stall ``uncached`` prompt tokens of prefill add to the ``decoding``
    requests decoding on a replica, summed over them: each step that carries a
    chunk lasts as long as the engine computes it, ``prefill_s_per_token`` a
    token.  Not the learned rate: a first token's wait also carries the decode
    work that shared its steps and the queue ahead, which delays no one.  Also a
    region's per-token price (``decoding`` its mean, ``uncached`` 1)."""
    return config.harm_weight * uncached * config.prefill_s_per_token * decoding


def slot_wait_s(config: MeridianConfig, model: ReplicaModel) -> float:
    """Seconds until a batch slot frees for one more request on a replica that
    this balancer already sent ``max_num_seqs`` or more: the excess start as
    running ones finish, ``max_num_seqs`` per request lifetime there."""
    excess = len(model.inflight) + 1 - config.max_num_seqs
    if excess <= 0:
        return 0.0
    return excess * model.mean_output * model.itl_s / config.max_num_seqs


def decode_cost_s(config: MeridianConfig, running: float, output: int) -> float:
    """Decode seconds ``output`` tokens cost where ``running`` sequences decode: its
    own steps, each one sequence fuller than now, and the same slowdown of the
    ``running`` ones."""
    step = config.step_s + (running + 1 + config.harm_weight * running) * config.seq_s
    return config.decode_weight * output * step


def pressure_s(config: MeridianConfig, model: ReplicaModel, kv_tokens: int) -> float:
    """Seconds until the replica frees room for ``kv_tokens`` more KV tokens."""
    held = max(model.kv_tokens, int(model.kv_usage * config.kv_capacity_tokens))
    overflow = held + kv_tokens - config.kv_capacity_tokens
    if overflow <= 0:
        return 0.0
    return drain_s(overflow, held, model)


def drain_s(overflow: int, held: int, model: ReplicaModel) -> float:
    """Seconds until ``overflow`` KV tokens are freed on a replica holding ``held``.

    The held tokens drain as their requests finish decoding, over about one
    request lifetime there (its mean output x itl): the overflow frees in that
    share of it.
    """
    return overflow * model.mean_output * model.itl_s / max(1, held)


def clamp(value: float, low: float, high: float) -> float:
    return min(high, max(low, value))


def ewma(alpha: float, current: float, sample: float) -> float:
    return current + alpha * (sample - current)
