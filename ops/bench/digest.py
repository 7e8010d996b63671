"""The prefix digest a region reports to its peers: what building, sending and
matching it cost (``manage.py bench routing``, last table).

A radix tree of four replicas is filled to its per-replica bound with
conversation-shaped paths (eight shared 128-block system prompts, 400
conversations growing by 5-60 blocks a turn), at the bounds of three engine
shapes: an 8k-token KV cache (512 blocks), an L4's 32k (2,048) and an H100's
~480k (30,000).  Then, median microseconds of: ``digest_of`` (the sampling walk),
``encode`` (the heartbeat's base64 words, not cached), ``decode`` (a peer reading
it) and ``held_blocks`` of a 2,048-block prompt that extends a held path.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from core.prefix_digest import PrefixDigest, digest_of
from core.radix_tree import RadixTree

SHAPES = (("8k KV", 512), ("L4 32k", 2048), ("H100 480k", 30_000))
TENANTS = ("r0", "r1", "r2", "r3")


def filled_tree(bound_blocks: int, seed: int, turns: int) -> tuple[RadixTree, list[int]]:
    """A tree at ``bound_blocks`` per replica, and one held conversation path."""
    rng = random.Random(seed)
    tree = RadixTree(bound_blocks)
    systems = [[rng.getrandbits(64) for _ in range(128)] for _ in range(8)]
    conversations: dict[int, list[int]] = {}
    path: list[int] = []
    for _ in range(turns):
        c = rng.randrange(400)
        path = conversations.get(c) or systems[c % len(systems)]
        path = path + [rng.getrandbits(64) for _ in range(rng.randrange(5, 60))]
        conversations[c] = path
        tree.insert(path, TENANTS[rng.randrange(len(TENANTS))])
    return tree, path


def _median_us(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000.0)
    samples.sort()
    return samples[len(samples) // 2]


def digest_table(seed: int, runs: int, turns: int) -> tuple[list[str], list[list[str]]]:
    headers = ["cache", "held blocks", "hashes", "stride", "wire KB", "build us",
               "encode us", "decode us", "match us"]  # fmt: skip
    rows = []
    for label, bound in SHAPES:
        tree, path = filled_tree(bound, seed, turns)
        prompt = path + [random.Random(seed).getrandbits(64) for _ in range(2048 - len(path))]

        def build(tree: RadixTree = tree) -> PrefixDigest:
            return digest_of(tree, set(TENANTS), block_tokens=16, min_stride=4, max_hashes=4096)

        digest = build()
        wire = digest.encode()
        held = sum(tree.size(t) for t in TENANTS)

        def encode(d: PrefixDigest = digest) -> object:
            return PrefixDigest(d.stride, d.block_tokens, d.hashes).encode()  # not cached

        def decode(w: dict[str, object] = wire) -> object:
            return PrefixDigest.decode(w)

        def match(p: list[int] = prompt, d: PrefixDigest = digest) -> object:
            return d.held_blocks(p)

        rows.append([
            label, str(held), str(len(digest.hashes)), str(digest.stride),
            f"{len(str(wire['blocks'])) / 1024:.1f}",
            f"{_median_us(build, runs):.0f}",
            f"{_median_us(encode, runs):.0f}",
            f"{_median_us(decode, runs):.0f}",
            f"{_median_us(match, runs * 20):.2f}",
        ])  # fmt: skip
    return headers, rows
