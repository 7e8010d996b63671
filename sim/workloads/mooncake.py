"""Mooncake (FAST'25) JSONL traces: arrival times, lengths and prefix-block ids.

Each line is ``{"timestamp": ms, "input_length": n, "output_length": m,
"hash_ids": [...]}``.  The trace has no text: ``hash_ids`` name 512-token prefix
blocks, and the same id in two requests means they share that block of KV cache.
We turn each id into a fixed 512-token text block generated from the id alone, so
shared ids become shared text, hence shared tokens and shared block hashes at the
replica.  The prompt is the concatenation of its blocks, cut to ``input_length``
tokens (the last block is usually partial); when a line has more input than its
blocks cover, the rest is filler unique to that line.

Requests go to ``/v1/completions`` with ``max_tokens=output_length`` and
``ignore_eos`` so the replica generates exactly the recorded length.

The trace has no user ids, but its multi-turn conversations show: a next turn
is a longer prompt that starts with every full block of an earlier request
(its prompt, then the reply and a new question).  Such a request takes the
earlier one's session key (``mooncake-<n>``, conversations numbered as they
start), so a replayer can keep a conversation with one user, in one region.
Requests that share a prefix without growing it (another question on the same
document, a prompt that diverges) start sessions of their own: they may be
anyone's.  In the shared synthetic trace, 758 of 3,993 requests continue an
earlier one (3,235 conversations); 1,024 more share a leading block with an
earlier request without continuing it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from sim.workloads.files import jsonl_records, require_int, require_object
from sim.workloads.program import ApiKind, Program, Step, TraceFormatError
from sim.workloads.text import WORDS, seeded

MOONCAKE_BLOCK_TOKENS = 512


@lru_cache(maxsize=4096)
def block_words(hash_id: int) -> tuple[str, ...]:
    """The 512 words of block ``hash_id``; the same id gives the same words everywhere.

    Bounded cache: the shared trace has ~44k distinct blocks, and a hot block is
    reused within a short window, so a few thousand cover the reuse.
    """
    return tuple(seeded("mooncake-block", hash_id).choices(WORDS, k=MOONCAKE_BLOCK_TOKENS))


def block_text(hash_id: int, tokens: int = MOONCAKE_BLOCK_TOKENS) -> str:
    """The first ``tokens`` tokens of block ``hash_id``.

    Every word keeps its leading space, so blocks concatenate without fusing and a
    prompt of blocks has exactly the sum of their token counts.
    """
    return "".join(" " + word for word in block_words(hash_id)[:tokens])


def mooncake_prompt(hash_ids: Sequence[int], input_length: int, line: int) -> str:
    """A prompt of exactly ``input_length`` tokens built from the given blocks."""
    parts = []
    remaining = input_length
    for hash_id in hash_ids:
        if remaining <= 0:
            break
        take = min(remaining, MOONCAKE_BLOCK_TOKENS)
        parts.append(block_text(hash_id, take))
        remaining -= take
    if remaining > 0:
        # Seeded by line: the uncovered tail belongs to this request only.
        rng = seeded("mooncake-tail", line)
        parts.append("".join(" " + word for word in rng.choices(WORDS, k=remaining)))
    return "".join(parts)


class Conversations:
    """Which conversation each request belongs to, by the prefix it continues."""

    def __init__(self) -> None:
        # An earlier request's full blocks -> (its session, its input length).
        self._turns: dict[tuple[int, ...], tuple[int, int]] = {}
        self._depths: set[int] = set()
        self.started = 0

    def session(self, hash_ids: Sequence[int], input_length: int) -> int:
        """The session of the latest request this one continues, else a new one."""
        session = self._continued(hash_ids, input_length)
        if session is None:
            session, self.started = self.started, self.started + 1
        full = min(input_length // MOONCAKE_BLOCK_TOKENS, len(hash_ids))
        if full:
            self._turns[tuple(hash_ids[:full])] = (session, input_length)
            self._depths.add(full)
        return session

    def _continued(self, hash_ids: Sequence[int], input_length: int) -> int | None:
        for depth in sorted((d for d in self._depths if d <= len(hash_ids)), reverse=True):
            earlier = self._turns.get(tuple(hash_ids[:depth]))
            if earlier is not None and earlier[1] < input_length:
                return earlier[0]
        return None


class MooncakeTrace:
    """Programs from a Mooncake JSONL file: one single-request program per line."""

    name = "mooncake"
    timed = True

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def programs(self) -> Iterator[Program]:
        conversations = Conversations()
        for index, (line, raw) in enumerate(jsonl_records(self.path)):
            yield self._program(index, line, require_object(self.path, line, raw), conversations)

    def _program(
        self, index: int, line: int, record: dict[str, Any], conversations: Conversations
    ) -> Program:
        timestamp = record.get("timestamp")
        if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or timestamp < 0:
            raise TraceFormatError(
                self.path, line, f"'timestamp' must be a number of ms >= 0, got {timestamp!r}"
            )
        input_length = require_int(self.path, line, record, "input_length", 1)
        output_length = require_int(self.path, line, record, "output_length", 0)
        hash_ids = record.get("hash_ids")
        if not isinstance(hash_ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in hash_ids
        ):
            raise TraceFormatError(self.path, line, "'hash_ids' must be a list of integers")
        step = Step(
            kind=ApiKind.COMPLETION,
            prompt=mooncake_prompt(hash_ids, input_length, line),
            # An engine rejects max_tokens=0; one token is the closest honest request.
            max_tokens=max(1, output_length),
            ignore_eos=True,
        )
        session = conversations.session(hash_ids, input_length)
        return Program(
            program_id=index,
            session_key=f"mooncake-{session}",
            steps=(step,),
            start=timestamp / 1000,
        )
