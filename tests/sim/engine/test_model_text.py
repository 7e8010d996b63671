"""The emulated replica with the model's own tokenizer files (vLLM's ``--tokenizer DIR``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.model_tokenizer import ModelTokenizer
from core.prompts import ChatPrompt, TextPrompt, prompt_tokens
from core.tokenizer import WordTokenizer, render_chat
from ops.bench.model_fixture import BOS, write_model_tokenizer
from sim.engine import Vocabulary
from sim.engine.model_text import ModelText, model_words
from sim.engine.openai_protocol import APIError, GenerationRequest, Kind, parse_generation
from sim.serve import model_tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    return model_tokenizer(str(write_model_tokenizer(tmp_path_factory.mktemp("model"))))


@pytest.fixture(scope="module")
def vocab(model: ModelTokenizer) -> Vocabulary:
    return Vocabulary(ModelText(model), extra_words=model_words(model))


def parse(
    model: ModelTokenizer, vocab: Vocabulary, kind: Kind, **body: object
) -> GenerationRequest:
    return parse_generation(
        kind,
        json.dumps({"model": "m", **body}).encode(),
        model="m",
        tokenizer=ModelText(model),
        vocab=vocab,
        max_model_len=4096,
        encoder=model,
    )


def test_chat_is_rendered_with_the_models_template_and_tokenized_as_vllm_does(
    model: ModelTokenizer, vocab: Vocabulary
) -> None:
    parsed = parse(model, vocab, "chat", messages=MESSAGES)
    assert parsed.prompt_token_ids == list(prompt_tokens(ChatPrompt(MESSAGES), model))
    bos = model.encode_whole(BOS, add_special_tokens=False)
    assert parsed.prompt_token_ids[:1] == bos  # from the template, not added twice
    assert parsed.prompt_token_ids != WordTokenizer().encode(render_chat(MESSAGES))
    completion = parse(model, vocab, "completion", prompt="Hello there")
    assert completion.prompt_token_ids == list(prompt_tokens(TextPrompt("Hello there"), model))
    assert completion.prompt_token_ids[:1] == bos  # completions: the tokenizer adds BOS
    ids = parse(model, vocab, "completion", prompt=[5, 6, 7])
    assert ids.prompt_token_ids == [5, 6, 7]


def test_a_template_refusal_is_a_400(model: ModelTokenizer, vocab: Vocabulary) -> None:
    with pytest.raises(APIError, match="unknown role") as refused:
        parse(model, vocab, "chat", messages=[{"role": "narrator", "content": "Once"}])
    assert refused.value.status == 400


def test_generated_words_are_single_model_tokens_that_round_trip(
    model: ModelTokenizer, vocab: Vocabulary
) -> None:
    assert len(vocab) > 100
    ids = vocab.token_ids[:64]
    assert ModelText(model).encode(vocab.text(ids)) == ids


def test_a_directory_without_tokenizer_json_stops_the_replica(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no tokenizer\.json"):
        model_tokenizer(str(tmp_path))
