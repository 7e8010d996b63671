"""Meridian's peer regions: what each holds of a prompt, and a forward's price.

``core.policies.meridian`` documents the terms (``Peer g`` there).  A peer
is priced as a replica seen from here: its round trip, the seconds it reports
for itself, its prefill of the prompt tokens it lacks and the output's decode at
its reported per-token prices, and the locality the forward leaves behind.

What a peer holds comes from two sources (``PeerHoldings``): the digest the peer
reports of its own replicas (``core.prefix_digest``), and what this
balancer forwarded there since that report, kept as the peer's tenancy of the
policy's radix tree and cleared at each new report.  A peer that reports no
digest keeps every forward in the tree, SkyLB's snapshot of what went there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from core.policy import Choice, Option
from core.prefix_digest import PrefixDigest
from core.radix_tree import RadixTree
from core.types import RequestDescriptor, TargetState


class PeerHoldings:
    """What each peer region holds of a prompt, as this balancer knows it."""

    def __init__(self, tree: RadixTree, block_tokens: int) -> None:
        self.tree = tree
        self.block_tokens = block_tokens
        # Peers this balancer forwarded to: tenants of the radix tree too, kept when
        # the local targets change.
        self.peer_ids: set[str] = set()
        # The digest each peer reported last, as this policy last priced it.
        self._seen: dict[str, PrefixDigest] = {}

    def usable(self, digests: Mapping[str, PrefixDigest]) -> dict[str, PrefixDigest]:
        """The peers' digests keyed by blocks of this balancer's size (another size
        hashes other blocks: nothing in it could match)."""
        size = self.block_tokens
        return {peer: d for peer, d in digests.items() if d.block_tokens == size}

    def uncached(
        self,
        request: RequestDescriptor,
        peers: Sequence[TargetState],
        told: Mapping[str, PrefixDigest],
    ) -> dict[str, int]:
        """This prompt's uncached tokens at each peer holding part of it: what the
        peer says it holds (its digest), or what this balancer forwarded there since
        that digest, whichever is more.  A peer that reports no digest is priced by
        every forward still in the tree."""
        for peer_id, report in told.items():
            seen = self._seen.get(peer_id)
            if seen is report:
                continue
            self._seen[peer_id] = report
            if seen != report:
                # News: what went there before it is in it, or was evicted.  A report
                # that says what the last one said is none (the live poller decodes
                # each poll anew; the simulator hands over one object until it changes).
                self.tree.remove_tenant(peer_id)
        blocks = request.block_hashes
        if not blocks:
            return {}
        size, prompt = self.block_tokens, request.prompt_tokens
        # One walk over the few peers: a union with every local id would build a set
        # of all of them per decision.
        depths = self.tree.match_depths(blocks, [p.target_id for p in peers])
        out = {peer: max(0, prompt - d * size) for peer, d in depths.items()}
        for peer in peers:
            said = told.get(peer.target_id)
            held = said.held_blocks(blocks) if said is not None else 0
            if held:
                uncached = max(0, prompt - held * size)
                out[peer.target_id] = min(out.get(peer.target_id, prompt), uncached)
        return out

    def forwarded(self, request: RequestDescriptor, peer_id: str) -> None:
        """``request`` went to ``peer_id``: its balancer routes it to a replica there,
        and later turns of the same program find its prefix under the peer's name
        (until the peer's next digest says what it holds, where it reports one)."""
        self.peer_ids.add(peer_id)
        self.tree.insert(request.block_hashes, peer_id)


@dataclass(frozen=True, slots=True)
class ForwardTerms:
    """This region's side of a forward's price, the same for every peer.

    ``per_token``: seconds per prompt token of prefill here (its rate and its harm
    to the decoders here); ``decode_per_token``: this region's decode terms per
    output token (``reuse``-weighted), standing in for a peer that reports none;
    ``reuse``: how likely a later request extends this one; ``home_uncached``: the
    prompt's uncached tokens at its best local holder (None: no local replica,
    nothing to leave behind); ``displace_weight``: the weight of what a copy
    abroad displaces there (0: not priced); ``rate``: this region's prefill seconds
    per token, for a forward's own wait for its first token; ``ttft_slo_s``: the
    SLO that wait is held to (0: none) and ``miss_s`` the price of missing it."""

    prompt: int
    output: int
    per_token: float
    decode_per_token: float
    reuse: float
    home_uncached: int | None
    step_s: float
    displace_weight: float = 1.0
    rate: float = 0.0
    ttft_slo_s: float = 0.0
    miss_s: float = 0.0


def best_peer(
    terms: ForwardTerms,
    peers: Sequence[TargetState],
    at_peers: Mapping[str, int],
    queued_s: Mapping[str, float] | None = None,
) -> Choice:
    """The cheapest peer to forward to, and its price (ties to the lower id);
    ``queued_s``: the wait in the queue of each held-back peer, by id."""
    waits = queued_s or {}
    left_behind = 0.0
    if terms.home_uncached is not None:
        left_behind = terms.reuse * (terms.home_uncached + terms.output) * terms.per_token
    # What the peer's own decoders change (its prefill's harm, its decode steps)
    # delays the requests that wait on this one: weighted by ``reuse`` (``price(g)``
    # in the policy's docstring); the rest of its price is this region's.
    chained = terms.reuse

    def cost(peer: TargetState) -> float:
        rtt_ms = peer.extra.get("rtt_ms", math.inf)
        rtt = rtt_ms / 1000.0 if math.isfinite(rtt_ms) else math.inf
        uncached = at_peers.get(peer.target_id, terms.prompt)
        # Forwarding leaves locality behind where home holds more of the prompt, or
        # where neither holds any of it (the policy's docstring says why).
        home = terms.home_uncached
        lost = 0.0
        if home is not None and (uncached > home or uncached == home == terms.prompt):
            lost = left_behind
        # The peer's own prices where it reports them (its decoders, not ours).
        prefill = terms.per_token
        decode = terms.decode_per_token
        if "prefill_s_per_token" in peer.extra:
            prefill += chained * (peer.extra["prefill_s_per_token"] - terms.per_token)
        if "decode_s_per_token" in peer.extra:
            decode = chained * peer.extra["decode_s_per_token"]
        here = uncached * prefill + terms.output * decode + terms.step_s
        # The copy displaces what the peer's caches hold for its own clients (full in
        # steady state: an LRU keeps everything until it needs the room), reused
        # about as often as here: each copied token is one they will prefill again.
        # Not where the program lives there: a copy here would be the larger one.
        displaced = 0.0
        if home is None or uncached >= home:
            displaced = terms.displace_weight * terms.reuse * uncached * prefill
        wait = peer.extra.get("estimate_s", 0.0) + waits.get(peer.target_id, 0.0)
        # Its own wait for the first token there: the round trip, the peer's queue and
        # its prefill of what it lacks, at this region's rate (the peer reports its
        # price with the harm in it, not its rate alone).
        missed = 0.0
        slo = terms.ttft_slo_s
        if slo > 0 and rtt + wait + terms.step_s + uncached * terms.rate > slo:
            missed = terms.miss_s
        return rtt + wait + here + lost + displaced + missed

    best = min(peers, key=lambda p: (cost(p), p.target_id))
    return Choice(Option.PEER, best, cost(best))
