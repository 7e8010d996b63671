"""Each served model's prompt encoder, read from disk once, and tokenization off the loop.

``MERIDIAN_MODEL_TOKENIZERS`` names, per model, a directory in the Hugging Face
layout (``tokenizer.json``, ``tokenizer_config.json``, optionally
``chat_template.jinja``) or a ``tokenizer.json`` path (its directory's
``tokenizer_config.json`` is read when there is one).  This module reads the
files at start-up, so a missing or broken file stops the balancer with a clear
message instead of routing on wrong tokens; ``core.model_tokenizer``
interprets them.  A model not named gets the fallback encoder (Meridian's word
tokenizer, or ``MERIDIAN_TOKENIZER_JSON``, with Meridian's fixed template),
which ``/internal/state`` reports as ``fallback``.

Tokenizing is the costliest step of describing a request (``manage.py bench
routing``), and the balancer is one event loop: a 32k-token prompt tokenized
inline would stall every other request for milliseconds.  So prompts above
``MERIDIAN_TOKENIZE_THREAD_CHARS`` characters are rendered and tokenized in a
worker thread (Hugging Face ``tokenizers`` releases the GIL while it encodes a
batch); small ones stay inline, where a thread hop would cost more than it saves.
Each encoder keeps a cache of the prompt segments it tokenized, at most
``MERIDIAN_TOKENIZE_CACHE_TOKENS`` token ids (``core.segments``), so a
follow-up chat turn tokenizes only its new message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from core.model_tokenizer import (
    TOKENIZER_JSON,
    ModelTokenizer,
    TokenizerFiles,
    tokenizer_files,
)
from core.prompts import (
    FallbackEncoder,
    Prompt,
    PromptEncoder,
    prompt_tokens,
)
from core.segments import DEFAULT_CACHE_TOKENS
from core.tokenizer import build_tokenizer


def read_tokenizer_files(path: str) -> TokenizerFiles:
    """The files of a model directory or of a ``tokenizer.json`` path."""
    given = Path(path)
    directory = given if given.is_dir() else given.parent

    def read(name: str) -> str | None:
        file = given if name == TOKENIZER_JSON and not given.is_dir() else directory / name
        return file.read_text(encoding="utf-8") if file.is_file() else None

    return tokenizer_files(path, read)


class ModelEncoders:
    """The prompt encoder of every model this balancer routes."""

    def __init__(
        self,
        paths: Mapping[str, str],
        *,
        fallback_tokenizer_json: str = "",
        thread_chars: int = 16384,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
    ) -> None:
        self.fallback: PromptEncoder = FallbackEncoder(
            build_tokenizer(fallback_tokenizer_json or None), cache_tokens=cache_tokens
        )
        self.thread_chars = thread_chars
        self._by_model: dict[str, PromptEncoder] = {
            model: ModelTokenizer(
                read_tokenizer_files(path), now=datetime.now, cache_tokens=cache_tokens
            )
            for model, path in paths.items()
        }

    def for_model(self, model: str) -> PromptEncoder:
        return self._by_model.get(model, self.fallback)

    def offloads(self, prompt: Prompt) -> bool:
        return prompt.size > self.thread_chars

    async def tokens(self, model: str, prompt: Prompt) -> Sequence[int]:
        """The prompt's token ids; large prompts are tokenized in a worker thread."""
        encoder = self.for_model(model)
        if self.offloads(prompt):
            return await asyncio.to_thread(prompt_tokens, prompt, encoder)
        return prompt_tokens(prompt, encoder)
