"""A request's prompt as the engine will see it, and the encoders that turn it into tokens.

``parse_request`` reduces every route's prompt to one of three values:

* ``ChatPrompt``: messages (and what vLLM's chat path also reads: ``tools``,
  ``documents``, ``add_generation_prompt``, ``continue_final_message``,
  ``chat_template_kwargs``, ``add_special_tokens``), which the served model's
  encoder renders with its chat template, then tokenizes;
* ``TextPrompt``: a completion's text, tokenized as is;
* ``TokenPrompt``: token ids the client sent, used unchanged.

Special tokens follow vLLM's OpenAI server: a chat prompt is tokenized with
``add_special_tokens=False`` by default (the template already wrote the BOS
token; adding one again would double it), a completion prompt with ``True``
(its BOS comes from the tokenizer).  A request may override either with its own
``add_special_tokens``, as vLLM allows.

``PromptEncoder`` is what the balancer keeps per model: a ``ModelTokenizer``
(``core.model_tokenizer``) when the model's tokenizer files are
configured, else ``FallbackEncoder``, Meridian's own word tokenizer and fixed
template, which only matches engines that render and tokenize the same way (the
emulated replica).  ``describe_source`` says which one a model uses, for
``/internal/state``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.segments import (
    DEFAULT_CACHE_TOKENS,
    SegmentCache,
    SegmentedEncoder,
    split_after,
)
from core.tokenizer import HEADER_END, Tokenizer, WordTokenizer, render_chat

FALLBACK = "fallback"
# Roles whose messages are a conversation's own history (a reply, or a tool's answer to one).
_HISTORY_ROLES = frozenset({"assistant", "tool", "function"})


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Any] | None = None
    documents: Sequence[Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    add_special_tokens: bool = False

    @property
    def size(self) -> int:
        """Characters of message text: what tokenizing it costs, roughly."""
        return sum(_content_chars(m.get("content")) for m in self.messages)


@dataclass(frozen=True, slots=True)
class TextPrompt:
    text: str
    add_special_tokens: bool = True

    @property
    def size(self) -> int:
        return len(self.text)


@dataclass(frozen=True, slots=True)
class TokenPrompt:
    token_ids: tuple[int, ...]

    @property
    def size(self) -> int:
        return 0  # nothing to tokenize


Prompt = ChatPrompt | TextPrompt | TokenPrompt


class PromptEncoder(Protocol):
    """Turns a model's prompts into the token ids its engine will see."""

    @property
    def tokenizer_source(self) -> str: ...

    @property
    def template_source(self) -> str: ...

    def render(self, prompt: ChatPrompt) -> str: ...

    def encode(self, text: str, *, add_special_tokens: bool) -> Sequence[int]: ...


def is_first_turn(messages: Sequence[Mapping[str, Any]]) -> bool:
    """No assistant (or tool) message yet: the chat carries no history of its own."""
    return not any(m.get("role") in _HISTORY_ROLES for m in messages)


def prompt_tokens(prompt: Prompt, encoder: PromptEncoder) -> Sequence[int]:
    """The prompt's token ids under ``encoder``: the expensive part of describing a request."""
    if isinstance(prompt, TokenPrompt):
        return prompt.token_ids
    if isinstance(prompt, ChatPrompt):
        return encoder.encode(encoder.render(prompt), add_special_tokens=prompt.add_special_tokens)
    return encoder.encode(prompt.text, add_special_tokens=prompt.add_special_tokens)


def prompt_text(prompt: Prompt, encoder: PromptEncoder) -> str:
    """The prompt as text (chat rendered); ``""`` for token ids."""
    if isinstance(prompt, ChatPrompt):
        return encoder.render(prompt)
    if isinstance(prompt, TextPrompt):
        return prompt.text
    return ""


def describe_source(encoder: PromptEncoder) -> dict[str, str]:
    """Where a model's tokens come from, as ``/internal/state`` shows it."""
    return {"tokenizer": encoder.tokenizer_source, "chat_template": encoder.template_source}


class FallbackEncoder:
    """Meridian's own tokenizer and fixed chat template, for models with no tokenizer files.

    Correct only against engines that render and tokenize the same way (the
    emulated replica); ``/internal/state`` reports such a model as ``fallback``.
    The word tokenizer has no special tokens, so ``add_special_tokens`` changes nothing.
    It ends a token after every punctuation character, so its text is tokenized in
    segments cut after each template header's ``|>`` through a segment cache
    (``core.segments``); any other tokenizer encodes the whole text.
    """

    template_source = FALLBACK

    def __init__(
        self, tokenizer: Tokenizer | None = None, *, cache_tokens: int = DEFAULT_CACHE_TOKENS
    ) -> None:
        self.tokenizer = tokenizer or WordTokenizer()
        self.segments: SegmentedEncoder | None = None
        if isinstance(self.tokenizer, WordTokenizer) and cache_tokens > 0:
            encode = self.tokenizer.encode
            self.segments = SegmentedEncoder(
                lambda texts: [encode(text) for text in texts], SegmentCache(cache_tokens), {}
            )

    @property
    def tokenizer_source(self) -> str:
        return FALLBACK if isinstance(self.tokenizer, WordTokenizer) else self.tokenizer.name

    def render(self, prompt: ChatPrompt) -> str:
        return render_chat(prompt.messages)

    def encode(self, text: str, *, add_special_tokens: bool) -> Sequence[int]:
        if self.segments is None:
            return self.tokenizer.encode(text)
        return self.segments.encode(split_after(text, HEADER_END))


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(str(p.get("text", ""))) for p in content if isinstance(p, Mapping))
    return 0
