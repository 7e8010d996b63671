"""Meridian's own chained block keys (blake2b), for the ``token_ids`` block identity.

Like vLLM's prefix cache, a full block of ``block_size`` tokens is identified by a
hash of (parent block hash, the block's token ids, extra keys such as a LoRA name).
Because each hash covers its parent, two prompts share block *i* only if they
share every token before it, so a list of block hashes is a prefix fingerprint.
The balancer keys requests with it, and re-keys engines' KV events with it from
their token ids (``core.event_keys``), so it never has to agree with an
engine's hash, only every balancer with the same ``seed``; the prefix policies
(trie, radix tree, hash ring) use it too.  vLLM's own hash is in
``core.block_identity``.

Partial trailing blocks are never hashed: engines only cache full blocks.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BLOCK_SIZE = 16
DEFAULT_SEED = "meridian"


def root_hash(seed: str = DEFAULT_SEED) -> int:
    """The parent hash of a sequence's first block, derived from the shared seed."""
    return int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "big")


def block_hash(parent: int, tokens: Sequence[int], extra: str = "") -> int:
    """Hash of one full block, chained to its parent's hash."""
    h = hashlib.blake2b(digest_size=8)
    h.update(parent.to_bytes(8, "big"))
    h.update(array("I", tokens).tobytes())
    if extra:
        h.update(b"\x00" + extra.encode())
    return int.from_bytes(h.digest(), "big")


def block_hashes(
    tokens: Sequence[int],
    *,
    block_size: int = BLOCK_SIZE,
    extra: str = "",
    seed: str = DEFAULT_SEED,
    parent: int | None = None,
) -> list[int]:
    """Hashes of every full block of ``tokens``, each chained to the one before.

    The first block chains to ``parent`` (a block hash computed earlier), or to the
    seed's root when None: a KV event that stores blocks after an already known one
    is keyed by continuing that block's chain (``core.block_identity``).

    Equal, value for value, to chaining ``block_hash`` over the blocks: blake2b of a
    concatenation equals blake2b fed the same bytes in pieces.  The token ids are
    packed once and each block fed to a copy of one primed hasher, which keeps
    hashing an 8k-token prompt well under a millisecond (``manage.py bench routing``).
    """
    packed = memoryview(array("I", tokens).tobytes())
    step = block_size * packed_itemsize()
    suffix = b"\x00" + extra.encode() if extra else b""
    # Copying a primed hasher is about twice as cheap as constructing one per block.
    blank = hashlib.blake2b(digest_size=8)
    previous = (root_hash(seed) if parent is None else parent).to_bytes(8, "big")
    hashes: list[int] = []
    for start in range(0, (len(tokens) // block_size) * step, step):
        h = blank.copy()
        h.update(previous)
        h.update(packed[start : start + step])
        if suffix:
            h.update(suffix)
        previous = h.digest()
        hashes.append(int.from_bytes(previous, "big"))
    return hashes


def packed_itemsize() -> int:
    """Bytes per token id in the hashed representation (array 'I')."""
    return array("I").itemsize
