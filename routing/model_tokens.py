"""Each served model's prompt encoder, read from disk once, and tokenization off the loop.

``MERIDIAN_MODEL_TOKENIZERS`` names, per model, a directory in the Hugging Face
layout (``tokenizer.json``, ``tokenizer_config.json``, optionally
``chat_template.jinja``) or a ``tokenizer.json`` path (its directory's
``tokenizer_config.json`` is read when there is one).  This module reads the
files at start-up, so a missing or broken file stops the balancer with a clear
message instead of routing on wrong tokens; ``routing.core.model_tokenizer``
interprets them.  A model not named gets the fallback encoder (Meridian's word
tokenizer, or ``MERIDIAN_TOKENIZER_JSON``, with Meridian's fixed template),
which ``/internal/state`` reports as ``fallback``.

Tokenizing is the costliest step of describing a request (``manage.py bench
routing``), and the balancer is one event loop: a 32k-token prompt tokenized
inline would stall every other request for milliseconds.  So prompts above
``MERIDIAN_TOKENIZE_THREAD_CHARS`` characters are rendered and tokenized in a
worker thread (Hugging Face ``tokenizers`` releases the GIL while it encodes a
batch); small ones stay inline, where a thread hop would cost more than it saves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

from routing.core.model_tokenizer import (
    ModelTokenizer,
    TokenizerFiles,
    TokenizerFilesError,
    load_config,
)
from routing.core.prompts import (
    FallbackEncoder,
    Prompt,
    PromptEncoder,
    prompt_tokens,
)
from routing.core.tokenizer import build_tokenizer

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"


def read_tokenizer_files(path: str) -> TokenizerFiles:
    """The files of a model directory or of a ``tokenizer.json`` path."""
    given = Path(path)
    directory = given if given.is_dir() else given.parent
    tokenizer_json = given / TOKENIZER_JSON if given.is_dir() else given
    if not tokenizer_json.is_file():
        raise TokenizerFilesError(f"{path}: no {TOKENIZER_JSON} there")
    config_path = directory / TOKENIZER_CONFIG
    config = (
        load_config(config_path.read_text(encoding="utf-8"), path) if config_path.is_file() else {}
    )
    template_path = directory / CHAT_TEMPLATE
    return TokenizerFiles(
        origin=path,
        tokenizer_json=tokenizer_json.read_text(encoding="utf-8"),
        config=config,
        chat_template=template_path.read_text(encoding="utf-8")
        if template_path.is_file()
        else None,
    )


class ModelEncoders:
    """The prompt encoder of every model this balancer routes."""

    def __init__(
        self,
        paths: Mapping[str, str],
        *,
        fallback_tokenizer_json: str = "",
        thread_chars: int = 16384,
    ) -> None:
        self.fallback: PromptEncoder = FallbackEncoder(
            build_tokenizer(fallback_tokenizer_json or None)
        )
        self.thread_chars = thread_chars
        self._by_model: dict[str, PromptEncoder] = {
            model: ModelTokenizer(read_tokenizer_files(path), now=datetime.now)
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
