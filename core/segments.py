"""Tokenize only what is new: a prompt in segments, each remembered in a bounded cache.

Multi-turn chat, the case prefix caching exists for, re-sends the whole
conversation every turn, so a balancer that tokenizes the rendered prompt from
scratch pays again for every earlier message.  This module cuts the text at
points where the tokenizer itself can never merge across (the *cut points*),
tokenizes each segment on its own, and keeps segment text -> ids in a
least-recently-used cache bounded by the total number of token ids it holds.
On a follow-up turn every earlier segment is a cache hit and only the new
message is tokenized.

The result equals whole-text encoding only when the cut points really are
boundaries the tokenizer never crosses:

* a Hugging Face tokenizer splits the text at its *added tokens* (the chat
  template's special tokens among them) before pre-tokenization and BPE run,
  so the ids of the pieces between them concatenate to the whole text's ids,
  provided the added tokens strip no neighbouring whitespace, are matched on the
  raw text, and the pre-tokenizer does not treat the first piece differently
  (``core.model_tokenizer`` checks this on probe texts at load, and
  encodes whole texts when it does not hold);
* Meridian's fallback word tokenizer ends a token after every punctuation
  character, so its text may be cut after the ``|>`` that closes each header of
  the fixed template.

A template without any added token between messages yields one segment, the
whole text: that is plain whole-text encoding (cached only for an exact repeat).
The tests check both claims against whole-text encoding with generated
conversations (``tests/core/test_segments.py``).
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

# Token ids held by one model's cache when the setting is not given: about 4 MB of
# ids (4 bytes each) plus the segment texts as keys.
DEFAULT_CACHE_TOKENS = 1_000_000

EncodeBatch = Callable[[list[str]], Sequence[Sequence[int]]]


@dataclass(frozen=True, slots=True)
class CacheStats:
    tokens: int  # ids held
    segments: int
    hit_tokens: int  # ids served from the cache since start
    miss_tokens: int  # ids tokenized since start


class SegmentCache:
    """Segment text -> token ids, least recently used first out, at most ``max_tokens`` ids.

    Thread-safe: the balancer tokenizes large prompts in worker threads while
    small ones are tokenized on the event loop, both against the same cache.
    Ids are stored packed (``array('I')``), 4 bytes per token.
    """

    def __init__(self, max_tokens: int = DEFAULT_CACHE_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[str, array[int]] = OrderedDict()
        self._tokens = 0
        self._hit_tokens = 0
        self._miss_tokens = 0
        self._lock = threading.Lock()

    def get(self, segment: str) -> array[int] | None:
        with self._lock:
            ids = self._entries.get(segment)
            if ids is not None:
                self._entries.move_to_end(segment)
                self._hit_tokens += len(ids)
            return ids

    def put(self, segment: str, ids: array[int]) -> None:
        with self._lock:
            self._miss_tokens += len(ids)
            # A segment bigger than the whole cache would only flush it.
            if len(ids) > self.max_tokens or segment in self._entries:
                return
            self._entries[segment] = ids
            self._tokens += len(ids)
            while self._tokens > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._tokens -= len(evicted)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._tokens, len(self._entries), self._hit_tokens, self._miss_tokens)


def added_token_splitter(tokens: Iterable[str]) -> re.Pattern[str]:
    """A pattern whose ``split`` keeps each added token as its own segment.

    Longest first, so that where one added token is a prefix of another the
    longer one wins, as the tokenizer's leftmost-longest matcher does."""
    ordered = sorted({t for t in tokens if t}, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")")


def split_at_added_tokens(text: str, splitter: re.Pattern[str]) -> list[str]:
    """``text`` cut before and after every added token, empty pieces dropped."""
    return [piece for piece in splitter.split(text) if piece]


def split_after(text: str, marker: str) -> list[str]:
    """``text`` cut right after every occurrence of ``marker``."""
    pieces = text.split(marker)
    last = pieces.pop()
    segments = [piece + marker for piece in pieces]
    if last:
        segments.append(last)
    return segments


class SegmentedEncoder:
    """Encodes a list of segments through ``cache``, tokenizing the misses in one batch.

    ``fixed`` maps the segments whose ids never change (the added tokens) to
    their id; they bypass the cache.  ``encode_batch`` tokenizes texts without
    special tokens added; it is called once per prompt, with the distinct misses.
    """

    def __init__(
        self, encode_batch: EncodeBatch, cache: SegmentCache, fixed: Mapping[str, int]
    ) -> None:
        self.encode_batch = encode_batch
        self.cache = cache
        self.fixed = dict(fixed)

    def encode(self, segments: Sequence[str]) -> array[int]:
        found: dict[str, array[int]] = {}
        misses: dict[str, None] = {}  # ordered and distinct
        for segment in segments:
            if segment in self.fixed or segment in found or segment in misses:
                continue
            cached = self.cache.get(segment)
            if cached is None:
                misses[segment] = None
            else:
                found[segment] = cached
        if misses:
            batch = list(misses)
            for segment, ids in zip(batch, self.encode_batch(batch), strict=True):
                packed = array("I", ids)
                self.cache.put(segment, packed)
                found[segment] = packed
        out = array("I")
        for segment in segments:
            fixed = self.fixed.get(segment)
            if fixed is None:
                out.extend(found[segment])
            else:
                out.append(fixed)
        return out
