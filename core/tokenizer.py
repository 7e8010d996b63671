"""One deterministic tokenizer, shared by the balancer and the emulated replicas.

Routing on prefixes only works when the balancer and the engine agree on token
boundaries, so both import this module.  The built-in ``WordTokenizer`` is a
GPT-2-like pre-tokenizer: a token is a run of letters/digits with the
whitespace before it, or one punctuation character with the whitespace before
it.  Ids are a stable hash of the token text, so no vocabulary file is needed
and the same text gives the same ids in every process and on every machine.

``HuggingFaceTokenizer`` loads a HuggingFace ``tokenizer.json`` instead (the
emulator's ``--tokenizer-json``, the balancer's ``MERIDIAN_TOKENIZER_JSON``).

Chat requests are rendered with one fixed template (``render_chat``) before
tokenizing, again so that both sides see identical prompts.  This module is the
balancer's *fallback*: a model with its own tokenizer files configured is
tokenized and rendered by ``core.model_tokenizer`` instead.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from tokenizers import Tokenizer as _HFTokenizer

# Leading whitespace belongs to the token that follows it (as in GPT-2's "Ġword").
# (The leading \s* is factored out of the alternation: same pieces, one less
# backtracking branch, ~25 % faster.)
_TOKEN_RE = re.compile(r"\s*(?:[A-Za-z0-9]+|[^\sA-Za-z0-9])|\s+$")

# A token never spans a non-space character followed by a space: the space starts
# the next token.  Cutting a text there tokenizes each piece exactly as the whole.
_CUT_RE = re.compile(r"\S(?=\s)")
# Characters tokenized per regex call.  One ``findall`` holds the GIL for its whole
# run, about 0.1 ms per kB here: a 4 MB prompt in a worker thread would still stall
# the balancer's event loop for 0.4 s in one piece.  Chunks of this size bound each
# hold to a few milliseconds.
TOKENIZE_CHUNK_CHARS = 32768

VOCAB_SIZE = 1 << 31
# What a chat prompt ends with: the header the model's reply follows.
GENERATION_PROMPT = "<|assistant|>"
# How every header of the fixed template ends; a token always ends after it.
HEADER_END = "|>"


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def count(self, text: str) -> int: ...


def _token_id(piece: str) -> int:
    # crc32 is stable across processes (unlike hash()) and fast.
    return zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE


class _IdCache(dict[str, int]):
    """Piece → id, filled on a miss.  ``map(cache.__getitem__, pieces)`` runs the hits
    in C, which an ``lru_cache`` wrapper per piece does not; bounded by clearing when
    full (a vocabulary's pieces come back at once)."""

    MAX_PIECES = 1 << 17

    def __missing__(self, piece: str) -> int:
        if len(self) >= self.MAX_PIECES:
            self.clear()
        value = self[piece] = _token_id(piece)
        return value


class WordTokenizer:
    """Deterministic word-piece tokenizer; ids are hashes of the piece text."""

    name = "meridian-word"

    def __init__(self) -> None:
        self._ids = _IdCache()

    def pieces(self, text: str) -> list[str]:
        if len(text) <= TOKENIZE_CHUNK_CHARS:
            return _TOKEN_RE.findall(text)
        return [piece for chunk in chunks(text) for piece in _TOKEN_RE.findall(chunk)]

    def encode(self, text: str) -> list[int]:
        if len(text) <= TOKENIZE_CHUNK_CHARS:
            return list(map(self._ids.__getitem__, _TOKEN_RE.findall(text)))
        ids: list[int] = []
        for chunk in chunks(text):
            ids.extend(map(self._ids.__getitem__, _TOKEN_RE.findall(chunk)))
        return ids

    def count(self, text: str) -> int:
        return sum(1 for chunk in chunks(text) for _ in _TOKEN_RE.finditer(chunk))


def chunks(text: str, size: int = TOKENIZE_CHUNK_CHARS) -> list[str]:
    """``text`` cut into pieces of about ``size`` characters, each cut where a token
    ends (``_CUT_RE``), so tokenizing the pieces gives the tokens of the whole.  A run
    of ``size`` characters without a space stays whole."""
    cuts, start = [], 0
    while len(text) - start > size:
        found = _CUT_RE.search(text, start + size)
        if found is None:
            break
        cuts.append(text[start : found.end()])
        start = found.end()
    cuts.append(text[start:])
    return cuts


class HuggingFaceTokenizer:
    """A HuggingFace ``tokenizer.json`` loaded through the ``tokenizers`` package."""

    def __init__(self, path: str) -> None:
        self._tok = _HFTokenizer.from_file(path)
        self.name = f"hf:{path}"

    def encode(self, text: str) -> list[int]:
        # The batch call releases the GIL (core.model_tokenizer explains why).
        (encoding,) = self._tok.encode_batch([text], add_special_tokens=False)
        return list(encoding.ids)

    def count(self, text: str) -> int:
        return len(self.encode(text))


def build_tokenizer(tokenizer_json: str | None = None) -> Tokenizer:
    """The configured tokenizer: a HuggingFace file when given, else the built-in one."""
    if tokenizer_json:
        return HuggingFaceTokenizer(tokenizer_json)
    return WordTokenizer()


def _content_text(content: Any) -> str:
    """Text of an OpenAI message ``content``: a string or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ValueError("message content must be a string or a list of content parts")


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """Render chat messages with Meridian's fixed template.

    The template is prefix-stable at the *token* level, which is what multi-turn
    KV reuse relies on: appending messages never changes the tokens of the ones
    before, and the generation prompt ends on a non-space character (``>``) so the
    reply, which the engine generates as space-led word tokens, tokenizes the same
    when the client sends it back as assistant history.  (A header ending in a
    newline would glue that newline to the reply's first word and break the chain
    of block hashes right where the reply starts.)
    """
    out = []
    for message in messages:
        role = str(message.get("role", "user"))
        out.append(f"<|{role}|>{_content_text(message.get('content'))}\n")
    out.append(GENERATION_PROMPT)
    return "".join(out)
