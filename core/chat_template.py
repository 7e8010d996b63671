"""Render chat messages with the served model's own Jinja chat template.

A chat request reaches the engine as text only after the engine renders its
``messages`` with the model's chat template; the balancer must render the very
same text, or its block hashes describe a prompt the engine never sees (the
vLLM production stack's KV-aware routing silently skipped every chat request
for exactly this reason).  So the template is rendered the way Hugging Face
``transformers`` renders it (``apply_chat_template``), which is what vLLM calls:

* an ``ImmutableSandboxedEnvironment`` (a template is configuration shipped with
  a model: it may not touch Python objects or mutate its inputs), with
  ``trim_blocks`` and ``lstrip_blocks``, and the ``loopcontrols`` extension;
* the globals ``raise_exception`` (a template refusing a conversation raises
  ``TemplateError``, which the balancer turns into a 400 as vLLM does) and
  ``strftime_now``, and a ``tojson`` filter that keeps non-ASCII text as is;
* the variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``,
  the tokenizer's special tokens (``bos_token``, ``eos_token``...) and the
  request's ``chat_template_kwargs`` on top.

``strftime_now`` reads a clock, and the core reads none of its own: the caller
passes ``now`` (templates such as Llama 3.1's print today's date).

``chat_template`` in ``tokenizer_config.json`` is a string or a list of named
templates; ``select_template`` picks ``tool_use`` for requests with tools when
the model has one, else ``default``, as ``transformers`` does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

Clock = Callable[[], datetime]
TemplateError = jinja2.TemplateError


class TemplateConfigError(ValueError):
    """The tokenizer configuration holds no usable chat template."""


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters and forces ASCII; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body unchanged.

    ``transformers`` uses the tag to mark assistant tokens for training masks; for
    rendering a prompt the body is all that matters, but a template using the tag
    must still compile.
    """

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def select_template(chat_template: Any, *, has_tools: bool) -> str:
    """The template source to use from a ``chat_template`` config value."""
    if isinstance(chat_template, str):
        return chat_template
    if isinstance(chat_template, Sequence) and chat_template:
        named = {}
        for entry in chat_template:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("template"), str):
                raise TemplateConfigError("chat_template entries must be {name, template} objects")
            named[str(entry.get("name"))] = entry["template"]
        if has_tools and "tool_use" in named:
            return str(named["tool_use"])
        if "default" in named:
            return str(named["default"])
        raise TemplateConfigError(f"chat_template names {sorted(named)} but no 'default' template")
    raise TemplateConfigError("chat_template must be a string or a list of named templates")


class ChatTemplate:
    """A model's chat template(s), compiled once, rendered per request.

    ``source`` is the ``chat_template`` config value (a string or named templates);
    ``special_tokens`` are the tokenizer's (``bos_token``...), visible to the template.
    """

    def __init__(
        self,
        source: Any,
        *,
        special_tokens: Mapping[str, str] | None = None,
        now: Clock | None = None,
    ) -> None:
        select_template(source, has_tools=False)  # fail at configuration, not per request
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._environment = _environment(now)
        self._compiled: dict[str, jinja2.Template] = {}
        for entry_source in _all_sources(source):
            self._template(entry_source)  # a syntax error stops start-up too

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        documents: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text the engine builds from ``messages``."""
        template = self._template(select_template(self.source, has_tools=bool(tools)))
        variables: dict[str, Any] = {
            **self.special_tokens,
            **(extra or {}),
            "messages": messages,
            "tools": tools or None,
            "documents": documents or None,
            "add_generation_prompt": add_generation_prompt,
        }
        text = template.render(**variables)
        if continue_final_message:
            return _cut_after_final_message(text, messages)
        return text

    def _template(self, source: str) -> jinja2.Template:
        compiled = self._compiled.get(source)
        if compiled is None:
            compiled = self._compiled[source] = self._environment.from_string(source)
        return compiled


def _all_sources(source: Any) -> list[str]:
    if isinstance(source, str):
        return [source]
    return [str(entry["template"]) for entry in source]


def _environment(now: Clock | None) -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    if now is not None:
        clock = now
        env.globals["strftime_now"] = lambda fmt: clock().strftime(fmt)
    return env


def _cut_after_final_message(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """``continue_final_message``: the prompt ends where the last message's text ends,
    so the model continues it (``transformers`` cuts the rendering the same way)."""
    content = messages[-1].get("content") if messages else None
    if isinstance(content, list):
        content = "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    if not isinstance(content, str) or not content.strip():
        return text
    end = text.rfind(content.strip())
    if end < 0:
        raise jinja2.TemplateError(
            "continue_final_message: the final message does not appear in the rendered prompt"
        )
    return text[: end + len(content.strip())]
