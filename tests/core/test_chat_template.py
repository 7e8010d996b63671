"""The model's own chat template, rendered as Hugging Face transformers renders it."""

from __future__ import annotations

from datetime import datetime

import pytest

from core.chat_template import ChatTemplate, TemplateConfigError, TemplateError
from core.prompts import ChatPrompt

# Llama 3's shape, written with the block tags whose whitespace trim_blocks/lstrip_blocks trim.
LLAMA3_LIKE = """{{ bos_token }}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('Conversation roles must be system, user or assistant') }}
    {% endif %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>
{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "  Hi!  "},
]


def test_a_template_renders_the_text_the_engine_builds() -> None:
    template = ChatTemplate(LLAMA3_LIKE, special_tokens={"bos_token": "<|begin_of_text|>"})
    # trim_blocks eats the newline after a block tag, never after a {{ variable }}.
    assert template.render(MESSAGES) == (
        "<|begin_of_text|>\n"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\n"
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\n"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    without = template.render(MESSAGES, add_generation_prompt=False)
    assert without.endswith("Hi!<|eot_id|>\n")


def test_raise_exception_refuses_a_conversation() -> None:
    template = ChatTemplate(LLAMA3_LIKE)
    with pytest.raises(TemplateError, match="roles must be"):
        template.render([{"role": "robot", "content": "x"}])


def test_tools_go_through_tojson_without_escaping_and_named_templates_are_chosen() -> None:
    named = [
        {"name": "default", "template": "{{ messages[0]['content'] }}"},
        {"name": "tool_use", "template": "{% for t in tools %}{{ t | tojson }}{% endfor %}"},
    ]
    template = ChatTemplate(named)
    tool = {"name": "météo", "description": "<weather>"}
    assert template.render(MESSAGES) == "Be brief."
    assert (
        template.render(MESSAGES, tools=[tool]) == '{"name": "météo", "description": "<weather>"}'
    )


def test_extra_variables_and_an_injected_clock_reach_the_template() -> None:
    source = "{{ strftime_now('%d %b %Y') }}{% if enable_thinking %} think{% endif %}"
    template = ChatTemplate(source, now=lambda: datetime(2026, 3, 1, 12, 0))
    assert template.render(MESSAGES, extra={"enable_thinking": True}) == "01 Mar 2026 think"


def test_the_sandbox_refuses_to_mutate_inputs() -> None:
    template = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(TemplateError):
        template.render(MESSAGES)


def test_continue_final_message_cuts_the_prompt_after_its_text() -> None:
    template = ChatTemplate(LLAMA3_LIKE)
    partial = [*MESSAGES, {"role": "assistant", "content": "Hello, I am"}]
    text = template.render(partial, add_generation_prompt=False, continue_final_message=True)
    assert text.endswith("<|end_header_id|>\n\nHello, I am")


@pytest.mark.parametrize(
    "source", [42, [], [{"name": "tool_use", "template": "x"}], [{"name": "default"}]]
)
def test_unusable_template_configs_are_refused_up_front(source: object) -> None:
    with pytest.raises(TemplateConfigError):
        ChatTemplate(source)


def test_a_template_syntax_error_is_refused_up_front() -> None:
    with pytest.raises(TemplateError):
        ChatTemplate("{% for m in messages %}")


def test_chat_prompt_size_counts_message_text() -> None:
    parts = [{"type": "text", "text": "abc"}, {"type": "image_url"}]
    assert (
        ChatPrompt([{"role": "user", "content": "hello"}, {"role": "user", "content": parts}]).size
        == 8
    )
