"""A model's tokenizer files: special tokens as vLLM adds them, the config's template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from core.model_tokenizer import (
    ModelTokenizer,
    TokenizerFiles,
    TokenizerFilesError,
    special_tokens,
)
from core.prompts import ChatPrompt, FallbackEncoder, TextPrompt, prompt_tokens
from ops.bench.model_fixture import BOS, CHAT_TEMPLATE, EOS, train_tokenizer

MESSAGES = [{"role": "user", "content": "Able about above."}]


@pytest.fixture(scope="module")
def tokenizer_json() -> str:
    return train_tokenizer().to_str()


def files(
    tokenizer_json: str, config: Mapping[str, Any], template: str | None = None
) -> TokenizerFiles:
    return TokenizerFiles("models/tiny", tokenizer_json, config, template)


CONFIG = {
    "bos_token": {"content": BOS, "special": True},
    "eos_token": EOS,
    "chat_template": CHAT_TEMPLATE,
}


def test_special_tokens_read_both_config_forms() -> None:
    assert special_tokens(CONFIG) == {"bos_token": BOS, "eos_token": EOS}


def test_chat_gets_its_bos_from_the_template_and_a_completion_from_the_tokenizer(
    tokenizer_json: str,
) -> None:
    model = ModelTokenizer(files(tokenizer_json, CONFIG))
    bos = train_tokenizer().token_to_id(BOS)
    chat = prompt_tokens(ChatPrompt(MESSAGES), model)
    assert chat[0] == bos and chat.count(bos) == 1  # vLLM: add_special_tokens=False for chat
    completion = prompt_tokens(TextPrompt("Able about above."), model)
    assert completion[0] == bos  # vLLM: add_special_tokens=True for completions
    assert (
        prompt_tokens(TextPrompt("Able about above.", add_special_tokens=False), model)
        == (completion[1:])
    )
    assert model.render(ChatPrompt(MESSAGES)).startswith(BOS + "<|start_header_id|>user")


def test_add_bos_token_false_in_the_config_is_obeyed(tokenizer_json: str) -> None:
    model = ModelTokenizer(files(tokenizer_json, {**CONFIG, "add_bos_token": False}))
    bos = train_tokenizer().token_to_id(BOS)
    assert bos not in prompt_tokens(TextPrompt("Able about above."), model)


def test_chat_template_jinja_wins_over_the_config_and_sources_say_so(tokenizer_json: str) -> None:
    model = ModelTokenizer(files(tokenizer_json, CONFIG, template="{{ messages[0]['content'] }}"))
    assert model.render(ChatPrompt(MESSAGES)) == "Able about above."
    assert model.template_source == "models/tiny (chat_template.jinja)"
    assert model.tokenizer_source == "models/tiny (tokenizer.json)"
    from_config = ModelTokenizer(files(tokenizer_json, CONFIG))
    assert from_config.template_source == "models/tiny (tokenizer_config.json)"


def test_a_model_without_template_routes_chat_with_the_fallback_rendering(
    tokenizer_json: str,
) -> None:
    model = ModelTokenizer(files(tokenizer_json, {}))
    assert model.template_source == "fallback"
    assert model.render(ChatPrompt(MESSAGES)) == FallbackEncoder().render(ChatPrompt(MESSAGES))


def test_broken_files_are_refused(tokenizer_json: str) -> None:
    with pytest.raises(TokenizerFilesError, match=r"not a tokenizer\.json"):
        ModelTokenizer(files("{}", CONFIG))
    with pytest.raises(TokenizerFilesError, match="not in the vocabulary"):
        ModelTokenizer(files(tokenizer_json, {"bos_token": "<nope>", "add_bos_token": True}))


def test_fallback_reports_itself() -> None:
    assert (FallbackEncoder().tokenizer_source, FallbackEncoder().template_source) == (
        "fallback",
        "fallback",
    )
