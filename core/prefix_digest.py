"""What a region caches, said to its peers: a sampled digest of its prefix tree.

A balancer that forwards a prompt has to price the prefill it will cost in the
peer region, and that depends on which of the prompt's blocks the peer's
replicas already hold.  Guessing it from this balancer's own forwards (the
peer as a tenant of the local radix tree) misses everything the peer's own
clients put there (a shared document first asked for abroad) and cannot hear
the peer's evictions (an 8k-token cache drops a forwarded system prompt long
before the guess forgets it).  So each region says what it holds, in its
availability heartbeat, and peers match prompts against that.

The digest is a set of block hashes.  Block hashes are chained (each covers
every token before it, ``core.blocks``), so holding block ``i`` of a
prompt means holding all of blocks ``0..i``: one hash stands for a whole path.
A region samples the paths of its radix tree (what its replicas hold, per
tenant LRU bounded by their KV capacity) at every ``stride``-th block of
absolute depth, plus the last block of every node (where prompts diverge or
end), most recently used paths first, up to ``max_hashes``.  Because a node is
never more recent than its parent, a truncated digest drops the deep, old
blocks first, and what it keeps is closed under prefixes at the stride
positions: the stride positions a prompt matches are a prefix of the prompt's
stride positions, so ``held_blocks`` finds the deepest by binary search
(``log2(prompt blocks / stride)`` set lookups; a 32k-token prompt at stride 4
takes 9).  The answer is exact at stride granularity: a prompt that diverges
from a held one between two stride positions is credited with the lower one,
at most ``stride - 1`` blocks short.

The stride doubles until the region's held blocks fit ``max_hashes``, so a
region with large caches (H100s: ~30k blocks per replica) says less about
each path rather than forgetting paths.  On the wire the hashes are 8-byte
little-endian words in base64 (``encode``/``decode``), with the stride and
the block size: a peer keying blocks by another size cannot use it.
"""

from __future__ import annotations

import base64
import binascii
from array import array
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from core.radix_tree import RadixTree

_WORD = "Q"  # unsigned 64-bit: block hashes are 8-byte digests
# A peer's digest is refused past this many hashes (512 KiB of words): sixteen times the
# default budget, room for a peer configured larger, and a bound on what one report may
# make this balancer hold.
MAX_WIRE_HASHES = 1 << 16
_LITTLE = array(_WORD, [1]).tobytes()[0] == 1


@dataclass(frozen=True)
class PrefixDigest:
    """The block hashes a region holds, sampled every ``stride`` blocks.  (No slots:
    the wire form is cached on the instance, since an idle region's digest is the
    same object report after report.)"""

    stride: int
    block_tokens: int
    hashes: frozenset[int]
    # The region's tree version it was built from: two reports of one version say
    # the same, and a later version is news even where the hashes did not change (a
    # forward that arrived and was evicted between two reports).
    version: int = 0

    def held_blocks(self, blocks: Sequence[int]) -> int:
        """Leading blocks of ``blocks`` the region holds, to ``stride`` granularity
        (the whole prompt when its last block is a node end the region holds)."""
        n = len(blocks)
        hashes = self.hashes
        if n == 0 or not hashes:
            return 0
        if blocks[-1] in hashes:
            return n
        stride = self.stride
        lo, hi = 0, n // stride  # the deepest k with blocks[k * stride - 1] held
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid * stride - 1] in hashes:
                lo = mid
            else:
                hi = mid - 1
        return lo * stride

    def encode(self) -> dict[str, object]:
        return {
            "stride": self.stride,
            "block_tokens": self.block_tokens,
            "version": self.version,
            "blocks": self._blocks,
        }

    @cached_property
    def _blocks(self) -> str:
        words = array(_WORD, sorted(self.hashes))
        if not _LITTLE:
            words.byteswap()
        return base64.b64encode(words.tobytes()).decode("ascii")

    @classmethod
    def decode(cls, raw: object) -> PrefixDigest:
        """A digest from its JSON form; ``ValueError`` when it is not one."""
        if not isinstance(raw, Mapping):
            raise ValueError("a prefix digest is an object")
        stride = _whole(raw, "stride", least=1)
        block_tokens = _whole(raw, "block_tokens", least=1)
        version = _whole(raw, "version", least=0)
        blocks = raw.get("blocks")
        if not isinstance(blocks, str):
            raise ValueError("a prefix digest's blocks are a base64 string")
        if len(blocks) > 4 * (8 * MAX_WIRE_HASHES + 2) // 3 + 4:
            raise ValueError(f"a prefix digest holds at most {MAX_WIRE_HASHES} hashes")
        try:
            packed = base64.b64decode(blocks, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("a prefix digest's blocks are not base64") from None
        if len(packed) % 8:
            raise ValueError("a prefix digest's blocks are not 8-byte words")
        if len(packed) > 8 * MAX_WIRE_HASHES:
            raise ValueError(f"a prefix digest holds at most {MAX_WIRE_HASHES} hashes")
        words = array(_WORD)
        words.frombytes(packed)
        if not _LITTLE:
            words.byteswap()
        return cls(stride, block_tokens, frozenset(words), version)


def _whole(raw: Mapping[str, object], key: str, *, least: int) -> int:
    """``raw[key]`` as an integer of at least ``least`` (not a bool), else ValueError."""
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"a prefix digest's {key} is an integer of at least {least}")
    return value


def digest_of(
    tree: RadixTree,
    tenants: Collection[str],
    *,
    block_tokens: int,
    min_stride: int,
    max_hashes: int,
) -> PrefixDigest:
    """The digest of what ``tenants`` hold in ``tree`` (see the module docstring)."""
    if min_stride < 1 or max_hashes < 1:
        raise ValueError("min_stride and max_hashes must be positive")
    paths = tree.held_paths(tenants)
    held = sum(len(node.edge) for _, _, node in paths)
    stride = min_stride
    while held > stride * max_hashes:
        stride *= 2
    # Most recent first, a path's shallower nodes before its deeper ones (a node is
    # never more recent than its parent, and ties go to the shallower).
    paths.sort(key=lambda p: (-p[0], p[1]))
    hashes: set[int] = set()
    for _, depth, node in paths:
        edge = node.edge
        # Absolute positions p with (p + 1) % stride == 0, then the node's last block.
        first = (stride - 1 - depth) % stride
        sampled = list(edge[first::stride])
        if not sampled or sampled[-1] != edge[-1]:
            sampled.append(edge[-1])
        room = max_hashes - len(hashes)
        if room <= 0:
            break
        hashes.update(sampled[:room])
    return PrefixDigest(stride, block_tokens, frozenset(hashes), tree.version)
