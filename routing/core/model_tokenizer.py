"""The served model's own tokenizer and chat template, from its Hugging Face files.

A model directory in the Hugging Face layout holds ``tokenizer.json`` (the
fast tokenizer: vocabulary, merges, added tokens, post-processor) and
``tokenizer_config.json`` (special tokens, ``add_bos_token``, and usually the
``chat_template``; newer exports put the template in ``chat_template.jinja``,
which then wins, as in ``transformers``).  The glue reads the files
(``routing.model_tokens``); this module only interprets their contents.

Tokenizing goes through Hugging Face ``tokenizers`` (Rust) the way a fast
tokenizer in ``transformers`` does, with two details that decide whether the
ids equal the engine's:

* ``add_bos_token``/``add_eos_token`` in the config rebuild the post-processor
  (``LlamaTokenizerFast.update_post_processor``), so a config that turns BOS off
  is obeyed even when ``tokenizer.json`` would add it;
* ``encode_batch_fast`` on a one-item batch, not ``encode``: only the batch calls
  release the GIL, which is what lets the balancer tokenize a long prompt in a
  worker thread while its event loop keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from routing.core.chat_template import ChatTemplate, Clock
from routing.core.prompts import FALLBACK, ChatPrompt
from routing.core.tokenizer import render_chat

SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TokenizerFilesError(ValueError):
    """The configured files are not a usable tokenizer."""


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """The contents of a model's tokenizer files, as read by the glue."""

    origin: str  # where they were read from (a directory or a tokenizer.json path)
    tokenizer_json: str
    config: Mapping[str, Any]  # tokenizer_config.json; {} when there is none
    chat_template: str | None = None  # chat_template.jinja, when present


def special_tokens(config: Mapping[str, Any]) -> dict[str, str]:
    """``bos_token`` and friends as strings (the config may store ``{"content": ...}``)."""
    found: dict[str, str] = {}
    for key in SPECIAL_TOKEN_KEYS:
        value = config.get(key)
        if isinstance(value, Mapping):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


class ModelTokenizer:
    """One model's tokenizer and chat template (a ``PromptEncoder``)."""

    def __init__(self, files: TokenizerFiles, *, now: Clock | None = None) -> None:
        try:
            self._tok = HFTokenizer.from_str(files.tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
            raise TokenizerFilesError(f"{files.origin}: not a tokenizer.json ({exc})") from exc
        self.tokenizer_source = f"{files.origin} (tokenizer.json)"
        tokens = special_tokens(files.config)
        _apply_bos_eos(self._tok, files.config, tokens)
        source = files.chat_template or files.config.get("chat_template")
        self.template: ChatTemplate | None = None
        self.template_source = FALLBACK
        if source:
            self.template = ChatTemplate(source, special_tokens=tokens, now=now)
            where = "chat_template.jinja" if files.chat_template else "tokenizer_config.json"
            self.template_source = f"{files.origin} ({where})"

    def render(self, prompt: ChatPrompt) -> str:
        if self.template is None:
            # A base model with no template: the engine would refuse chat (vLLM answers
            # 400 without --chat-template); Meridian's rendering still routes it.
            return render_chat(prompt.messages)
        return self.template.render(
            prompt.messages,
            tools=prompt.tools,
            documents=prompt.documents,
            add_generation_prompt=prompt.add_generation_prompt,
            continue_final_message=prompt.continue_final_message,
            extra=prompt.template_kwargs,
        )

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        (encoding,) = self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)


def load_config(text: str, origin: str) -> dict[str, Any]:
    """``tokenizer_config.json`` text as a dict, refusing anything else."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TokenizerFilesError(f"{origin}: tokenizer_config.json is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise TokenizerFilesError(f"{origin}: tokenizer_config.json is not an object")
    return config


def _apply_bos_eos(tok: HFTokenizer, config: Mapping[str, Any], tokens: Mapping[str, str]) -> None:
    """Rebuild the post-processor from ``add_bos_token``/``add_eos_token``, as
    ``transformers``' Llama-family fast tokenizers do, when the config sets either."""
    if "add_bos_token" not in config and "add_eos_token" not in config:
        return
    parts: list[tuple[str, int]] = []
    single = ["$A:0"]
    if config.get("add_bos_token") and "bos_token" in tokens:
        parts.append(_token_and_id(tok, tokens["bos_token"]))
        single.insert(0, f"{tokens['bos_token']}:0")
    if config.get("add_eos_token") and "eos_token" in tokens:
        parts.append(_token_and_id(tok, tokens["eos_token"]))
        single.append(f"{tokens['eos_token']}:0")
    pair = [*single, *(p.replace(":0", ":1").replace("$A", "$B") for p in single)]
    tok.post_processor = processors.TemplateProcessing(
        single=" ".join(single), pair=" ".join(pair), special_tokens=parts
    )


def _token_and_id(tok: HFTokenizer, token: str) -> tuple[str, int]:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise TokenizerFilesError(f"special token {token!r} is not in the vocabulary")
    return token, token_id
