"""SkyLB-CH: consistent hashing at both layers, skipping unavailable targets (SkyLB §3.2).

SkyLB-CH is *implicitly* prefix-aware: requests with the same key tend to share
a prefix, and the ring keeps them on one target.  Two extensions over plain
consistent hashing (Algorithm 1, lines 23-26):

1. It runs at both layers: locally the ring holds this balancer's replicas,
   remotely it holds the peer balancers (``remote_policy_name("skylb_ch")`` is
   ``skylb_ch``), so a session spilled to another region lands on the same
   region, and there on the same replica, every time.
2. Virtual nodes whose target is not *available* (not among the candidates the
   balancer passes after SP-P/SP-O filtering, §3.3) are skipped and the walk
   continues along the ring, so a busy owner sheds load to its ring successor
   instead of queueing it, and gets its sessions back as soon as it frees up.

The key (``key``): ``"session"`` (default, as in the paper's evaluation: user or
session id) uses the session key and falls back to the prefix when a request
has none; ``"prefix"`` always uses the chained hash of the first
``prefix_blocks`` blocks (16 tokens each), which already covers the whole
prefix before it.  A prompt shorter than one block has no prefix key and goes
to the least-loaded candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.hash_ring import DEFAULT_VNODES
from core.policies.consistent_hash import RingPolicy
from core.types import RequestDescriptor

KEY_KINDS = ("session", "prefix")


@dataclass(frozen=True, slots=True)
class SkyLBCHConfig:
    vnodes: int = DEFAULT_VNODES
    key: str = "session"
    # 8 blocks = 128 tokens: long enough to cover a typical system prompt's opening.
    prefix_blocks: int = 8

    def __post_init__(self) -> None:
        if self.key not in KEY_KINDS:
            raise ValueError(f"key must be one of {', '.join(KEY_KINDS)}, got {self.key!r}")
        if self.prefix_blocks < 1:
            raise ValueError("prefix_blocks must be at least 1")


class SkyLBCHPolicy(RingPolicy):
    name = "skylb_ch"

    def __init__(self, config: SkyLBCHConfig | None = None) -> None:
        self.config = config or SkyLBCHConfig()
        super().__init__(self.config.vnodes)

    def key_hash(self, request: RequestDescriptor) -> int | None:
        if self.config.key == "session" and request.session_key:
            return super().key_hash(request)
        blocks = request.block_hashes
        if not blocks:
            return None
        # Block hashes chain over their parents, so the n-th one fingerprints the
        # whole prefix up to it; it is already a uniform 64-bit blake2b value.
        return blocks[min(self.config.prefix_blocks, len(blocks)) - 1]
