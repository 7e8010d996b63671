"""Segmented tokenization: the ids equal whole-text encoding, and only new text is tokenized."""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors, trainers

from core.model_tokenizer import ModelTokenizer, TokenizerFiles
from core.prompts import ChatPrompt, FallbackEncoder
from core.segments import SegmentCache, SegmentedEncoder, split_after
from ops.bench.model_fixture import BOS, CHAT_TEMPLATE, EOS, train_tokenizer, training_corpus

# Headers written as plain text: the rendered prompt has no added token between messages.
PLAIN_TEMPLATE = (
    "{% for m in messages %}### {{ m['role'] }}:\n{{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant:\n{% endif %}"
)
# Mistral-like: [INST] ... [/INST] around user turns, </s> after replies.
INST_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
    "[INST] {{ m['content'] }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
)


def small_tokenizer(pre_tokenizer: Any, specials: list[str | AddedToken]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=["<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(1, 300), trainer)
    tok.add_special_tokens(specials)
    return tok


def model(tok: Tokenizer, template: str, bos: str = BOS, eos: str = EOS) -> ModelTokenizer:
    config = {"bos_token": bos, "eos_token": eos, "chat_template": template}
    return ModelTokenizer(TokenizerFiles("test", tok.to_str(), config))


@pytest.fixture(scope="module")
def llama3() -> Tokenizer:
    return train_tokenizer()


@pytest.fixture(scope="module")
def encoders(llama3: Tokenizer) -> dict[str, ModelTokenizer]:
    metaspace = small_tokenizer(
        pre_tokenizers.Metaspace(prepend_scheme="always"), ["<s>", "</s>", "[INST]", "[/INST]"]
    )
    prefixed = small_tokenizer(
        pre_tokenizers.ByteLevel(add_prefix_space=True), ["<s>", "</s>", "[INST]", "[/INST]"]
    )
    return {
        "llama3 template": model(llama3, CHAT_TEMPLATE),
        "plain template": model(llama3, PLAIN_TEMPLATE),
        "inst, metaspace": model(metaspace, INST_TEMPLATE, "<s>", "</s>"),
        "inst, byte-level with prefix space": model(prefixed, INST_TEMPLATE, "<s>", "</s>"),
    }


# Text that stresses the cut points: whitespace runs, newlines, non-ASCII, digits,
# punctuation, and the special tokens themselves inside a message.
CONTENT = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
        st.sampled_from([" ", "  ", "\n", "\n\n", " \n", "\t", "é", "你好", "123", ",", "..."]),
        st.sampled_from([BOS, EOS, "<|start_header_id|>", "<s>", "</s>", "[INST]", "[/INST]"]),
        st.sampled_from(["the", " model", "Hello", " world", "|>", "<|user|>"]),
    ),
    max_size=12,
).map("".join)
ROLES = st.sampled_from(["system", "user", "assistant"])
CONVERSATION = st.lists(st.fixed_dictionaries({"role": ROLES, "content": CONTENT}), min_size=1)


def alternate(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """user/assistant turns, as the [INST] template requires."""
    return [{**m, "role": "user" if i % 2 == 0 else "assistant"} for i, m in enumerate(messages)]


@settings(max_examples=60, deadline=None)
@given(conversation=CONVERSATION, follow_up=CONTENT)
def test_segmented_ids_equal_whole_text_ids(
    encoders: dict[str, ModelTokenizer], conversation: list[dict[str, str]], follow_up: str
) -> None:
    for name, encoder in encoders.items():
        messages = alternate(conversation) if name.startswith("inst") else conversation
        first = encoder.render(ChatPrompt(messages))
        turns = [*messages, {"role": "user", "content": follow_up}]
        second = encoder.render(ChatPrompt(alternate(turns) if name.startswith("inst") else turns))
        for text in (first, second, first):  # the repeat is served from the cache
            for special in (False, True):
                assert list(
                    encoder.encode(text, add_special_tokens=special)
                ) == encoder.encode_whole(text, add_special_tokens=special), (name, text, special)


@settings(max_examples=60, deadline=None)
@given(conversation=CONVERSATION, follow_up=CONTENT)
def test_fallback_segments_equal_whole_text_ids(
    conversation: list[dict[str, str]], follow_up: str
) -> None:
    cached, whole = FallbackEncoder(), FallbackEncoder(cache_tokens=0)
    assert cached.segments is not None and whole.segments is None
    for messages in (conversation, [*conversation, {"role": "user", "content": follow_up}]):
        text = cached.render(ChatPrompt(messages))
        assert list(cached.encode(text, add_special_tokens=False)) == list(
            whole.encode(text, add_special_tokens=False)
        )


def test_a_template_with_special_tokens_between_messages_is_cut_at_them(
    encoders: dict[str, ModelTokenizer],
) -> None:
    encoder = encoders["llama3 template"]
    text = encoder.render(ChatPrompt([{"role": "user", "content": "Hi there"}]))
    assert encoder.split(text) == [
        BOS, "<|start_header_id|>", "user", "<|end_header_id|>", "\n\nHi there", EOS,
        "<|start_header_id|>", "assistant", "<|end_header_id|>", "\n\n",
    ]  # fmt: skip
    plain = encoders["plain template"]
    text = plain.render(ChatPrompt([{"role": "user", "content": "Hi there"}]))
    assert plain.split(text) == [text]  # nothing to cut at: the whole text, as before


def test_a_follow_up_turn_tokenizes_only_its_new_message() -> None:
    encoder = ModelTokenizer(
        TokenizerFiles("t", train_tokenizer().to_str(), {"bos_token": BOS,
                                                         "chat_template": CHAT_TEMPLATE})
    )  # fmt: skip
    assert encoder.segments is not None
    history = [
        {"role": "system", "content": "You answer briefly. " * 30},
        {"role": "user", "content": "What is the capital of France? " * 20},
    ]
    encoder.encode(encoder.render(ChatPrompt(history)), add_special_tokens=False)
    before = encoder.segments.cache.stats()
    turn = [*history, {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Spain?"}]  # fmt: skip
    encoder.encode(encoder.render(ChatPrompt(turn)), add_special_tokens=False)
    after = encoder.segments.cache.stats()
    new = len(encoder.encode_whole("\n\nParis.", add_special_tokens=False)) + len(
        encoder.encode_whole("\n\nAnd of Spain?", add_special_tokens=False)
    )
    assert after.miss_tokens - before.miss_tokens == new
    assert after.hit_tokens - before.hit_tokens > 300  # the system prompt and first question


def test_tokenizers_whose_segments_could_differ_are_encoded_whole(llama3: Tokenizer) -> None:
    # Metaspace's "first" scheme puts its space only before the text's first word:
    # a segment after a special token would get one it should not have.
    first_only = small_tokenizer(pre_tokenizers.Metaspace(prepend_scheme="first"), ["<s>"])
    # A token that swallows the whitespace beside it changes its neighbours' ids.
    stripping = small_tokenizer(
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        [AddedToken("<mask>", lstrip=True, special=True)],
    )
    # No added token at all: there is nothing to cut at.
    bare = Tokenizer.from_str(llama3.to_str())
    config = json.loads(bare.to_str())
    config["added_tokens"] = []
    config["post_processor"] = None
    no_added = Tokenizer.from_str(json.dumps(config))
    for tok in (first_only, stripping, no_added):
        encoder = model(tok, PLAIN_TEMPLATE)
        assert encoder.segments is None
        text = "Hello <s> world<mask> again"
        assert encoder.split(text) == [text]
        assert list(encoder.encode(text, add_special_tokens=False)) == tok.encode(text).ids


def test_a_disabled_cache_encodes_whole_text(llama3: Tokenizer) -> None:
    encoder = ModelTokenizer(
        TokenizerFiles("t", llama3.to_str(), {"chat_template": CHAT_TEMPLATE}), cache_tokens=0
    )
    assert encoder.segments is None


def test_the_cache_is_bounded_by_tokens_least_recently_used_out() -> None:
    cache = SegmentCache(max_tokens=10)
    cache.put("a", array("I", range(4)))
    cache.put("b", array("I", range(4)))
    assert cache.get("a") is not None  # "a" is now the most recently used
    cache.put("c", array("I", range(4)))  # 12 > 10: the least recently used goes
    assert cache.get("b") is None
    assert cache.get("a") == array("I", range(4)) and cache.get("c") is not None
    cache.put("huge", array("I", range(11)))  # bigger than the cache: not kept
    assert cache.get("huge") is None
    stats = cache.stats()
    assert (stats.tokens, stats.segments) == (8, 2)


def test_misses_are_tokenized_once_in_one_batch() -> None:
    batches: list[list[str]] = []

    def encode_batch(texts: list[str]) -> list[list[int]]:
        batches.append(texts)
        return [[len(text)] for text in texts]

    encoder = SegmentedEncoder(encode_batch, SegmentCache(), {"<sep>": 99})
    assert list(encoder.encode(["ab", "<sep>", "abc", "<sep>", "ab"])) == [2, 99, 3, 99, 2]
    assert list(encoder.encode(["abc", "<sep>", "d"])) == [3, 99, 1]
    assert batches == [["ab", "abc"], ["d"]]


def test_split_after_keeps_every_character() -> None:
    assert split_after("<|user|>hi\n<|assistant|>", "|>") == ["<|user|>", "hi\n<|assistant|>"]
    assert split_after("a|>b", "|>") == ["a|>", "b"]
    assert split_after("", "|>") == []


def test_completion_prompts_keep_the_bos_the_post_processor_adds(llama3: Tokenizer) -> None:
    tok = Tokenizer.from_str(llama3.to_str())
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, 0), (EOS, 1)]
    )
    encoder = model(tok, CHAT_TEMPLATE)
    text = f"A completion prompt{EOS} with a token inside"
    assert encoder.segments is not None  # the segmented path, with the BOS and EOS around
    assert list(encoder.encode(text, add_special_tokens=True)) == tok.encode(text).ids
    assert list(encoder.encode(text, add_special_tokens=True))[:1] == [0]
