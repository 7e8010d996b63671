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

Text is tokenized in segments cut at the added tokens, each remembered in a
bounded cache (``core.segments``), so a follow-up chat turn tokenizes
only its new message.  That is exact only for tokenizers that never let a
segment's neighbours change its ids; ``_segmenter`` checks the tokenizer's
configuration and compares segmented with whole-text encoding on probe texts
at load, and a tokenizer failing either is encoded whole-text, as before.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from core.chat_template import ChatTemplate, Clock
from core.prompts import FALLBACK, ChatPrompt
from core.segments import (
    DEFAULT_CACHE_TOKENS,
    SegmentCache,
    SegmentedEncoder,
    added_token_splitter,
    split_at_added_tokens,
)
from core.tokenizer import render_chat

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

    def __init__(
        self,
        files: TokenizerFiles,
        *,
        now: Clock | None = None,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
    ) -> None:
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
        self.segments = _segmenter(self._tok, cache_tokens)
        # Where the post-processor puts its special tokens around the text (BOS...),
        # for segmented encoding with add_special_tokens=True; None: encode whole.
        self._wrapping = _special_wrapping(self._tok) if self.segments else None
        self._splitter = added_token_splitter(self.segments.fixed) if self.segments else None

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

    def encode(self, text: str, *, add_special_tokens: bool) -> Sequence[int]:
        """The text's ids; packed (``array('I')``) when segmented, which block hashing
        reads as is, with no list of Python ints built in between."""
        if self.segments is not None:
            if not add_special_tokens:
                return self.segments.encode(self.split(text))
            if self._wrapping is not None:
                before, after = self._wrapping
                return before + self.segments.encode(self.split(text)) + after
        return self.encode_whole(text, add_special_tokens=add_special_tokens)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def encode_whole(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """The text's ids from one tokenizer call, no segments, no cache."""
        (encoding,) = self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return list(encoding.ids)

    def split(self, text: str) -> list[str]:
        """The segments ``encode`` tokenizes separately (the whole text when not segmenting)."""
        if self._splitter is None:
            return [text]
        return split_at_added_tokens(text, self._splitter)


def _segmenter(tok: HFTokenizer, cache_tokens: int) -> SegmentedEncoder | None:
    """A segmented encoder for ``tok``, or None where segments could change the ids."""
    added = {token.content: token_id for token_id, token in tok.get_added_tokens_decoder().items()}
    if cache_tokens <= 0 or not added or not _splits_cleanly(tok):
        return None

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)]

    segmenter = SegmentedEncoder(encode_batch, SegmentCache(cache_tokens), added)
    splitter = added_token_splitter(added)
    for probe in _probes(list(added)):
        whole = encode_batch([probe])[0]
        if list(segmenter.encode(split_at_added_tokens(probe, splitter))) != whole:
            return None
    # Probing filled the cache with the probes: start empty.
    return SegmentedEncoder(encode_batch, SegmentCache(cache_tokens), added)


def _splits_cleanly(tok: HFTokenizer) -> bool:
    """Whether the tokenizer cuts added tokens out of the raw text and nothing else.

    An added token that strips the whitespace beside it (``lstrip``/``rstrip``),
    matches only whole words, or is matched on normalized text changes its
    neighbours; truncation or padding would apply to every segment."""
    if tok.truncation is not None or tok.padding is not None:
        return False
    for token in tok.get_added_tokens_decoder().values():
        if token.lstrip or token.rstrip or token.single_word:
            return False
        if token.normalized and tok.normalizer is not None:
            return False
    return True


def _probes(added: list[str]) -> list[str]:
    """Texts around every added token: neighbouring spaces, newlines, words, the token
    first and last, back to back, and a segment that is not the first starting with a
    space (pre-tokenizers that prepend a space to the first word only differ there)."""
    texts = []
    for token in added:
        texts += [
            f"Hello world{token} again",
            f"{token} leading space\n\n and {token}\n\ntrailing ",
            f"a {token}{token} b  {token}  c\n",
            f"x{token}x{token}",
            f"{token}\u00e9t\u00e9 \u4f60\u597d{token} 123,456.",
        ]
    texts.append("".join(f" w{i} {token}" for i, token in enumerate(added)))
    return texts


def _special_wrapping(tok: HFTokenizer) -> tuple[array[int], array[int]] | None:
    """The ids the post-processor adds before and after a text, when it only wraps it."""
    probe = "wrapping probe: one two"
    bare = tok.encode(probe, add_special_tokens=False).ids
    wrapped = tok.encode(probe, add_special_tokens=True).ids
    for start in range(len(wrapped) - len(bare) + 1):
        if wrapped[start : start + len(bare)] == bare:
            before, after = wrapped[:start], wrapped[start + len(bare) :]
            other = "another: three"
            other_bare = tok.encode(other, add_special_tokens=False).ids
            if tok.encode(other, add_special_tokens=True).ids == [*before, *other_bare, *after]:
                return array("I", before), array("I", after)
            return None
    return None


TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"


def tokenizer_files(origin: str, read: Callable[[str], str | None]) -> TokenizerFiles:
    """A model's files from ``read(file name)`` (its text, or None when absent): the
    Hugging Face layout, the same for the balancer and the emulated replica; the
    caller does the reading."""
    tokenizer_json = read(TOKENIZER_JSON)
    if tokenizer_json is None:
        raise TokenizerFilesError(f"{origin}: no {TOKENIZER_JSON} there")
    config_text = read(TOKENIZER_CONFIG)
    return TokenizerFiles(
        origin=origin,
        tokenizer_json=tokenizer_json,
        config=load_config(config_text, origin) if config_text is not None else {},
        chat_template=read(CHAT_TEMPLATE),
    )


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
