from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from core.blocks import BLOCK_SIZE, block_hashes, root_hash
from core.tokenizer import (
    _TOKEN_RE,
    WordTokenizer,
    build_tokenizer,
    chunks,
    render_chat,
)


def test_ids_are_stable_hashes_of_pieces_with_leading_space() -> None:
    tok = WordTokenizer()
    assert tok.pieces("Hello, world!\n") == ["Hello", ",", " world", "!", "\n"]
    assert tok.encode("a b a") == [tok.encode("a")[0], tok.encode(" b")[0], tok.encode(" a")[0]]
    assert tok.count("one two three") == len(tok.encode("one two three")) == 3


def test_a_reply_sent_back_as_history_keeps_every_token_of_the_turn_before() -> None:
    """Multi-turn KV reuse: turn 2's tokens start with turn 1's prompt plus the reply's
    tokens exactly as the engine generated them (space-led words)."""
    tok = WordTokenizer()
    turn1 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    reply = " kakasa lokasa nezoho"
    generated = tok.encode(reply)
    turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "More"}]
    first, second = tok.encode(render_chat(turn1)), tok.encode(render_chat(turn2))
    assert second[: len(first) + len(generated)] == first + generated


def test_content_parts_are_joined_and_bad_content_is_refused() -> None:
    parts = [{"type": "text", "text": "Hel"}, {"type": "image_url"}, {"type": "text", "text": "lo"}]
    assert render_chat([{"role": "user", "content": parts}]) == render_chat(
        [{"role": "user", "content": "Hello"}]
    )
    with pytest.raises(ValueError):
        render_chat([{"role": "user", "content": 42}])


def test_block_hashes_chain_over_full_blocks_only() -> None:
    tokens = list(range(3 * BLOCK_SIZE + 5))
    hashes = block_hashes(tokens)
    assert len(hashes) == 3
    # Same prefix, same hashes; one changed token changes its block and every later one.
    changed = tokens.copy()
    changed[BLOCK_SIZE + 1] = 999
    other = block_hashes(changed)
    assert other[0] == hashes[0] and other[1] != hashes[1] and other[2] != hashes[2]
    assert block_hashes(tokens, extra="lora-a")[0] != hashes[0]
    assert block_hashes(tokens, seed="other")[0] != hashes[0]
    assert root_hash() == root_hash("meridian")


def test_huggingface_tokenizer_json_is_pluggable(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="[UNK]")
    hf = tokenizers.Tokenizer(model)
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    assert json.loads(path.read_text())["model"]["type"] == "WordLevel"
    tok = build_tokenizer(str(path))
    assert tok.encode("hello world unknown") == [1, 2, 0]
    assert tok.count("hello world") == 2


def test_the_piece_id_cache_is_bounded_and_never_changes_an_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from core import tokenizer as module

    monkeypatch.setattr(module._IdCache, "MAX_PIECES", 8)
    tok = WordTokenizer()
    text = " ".join(f"w{i}" for i in range(50))
    first = tok.encode(text)
    assert len(tok._ids) <= 8
    assert tok.encode(text) == first == WordTokenizer().encode(text)


@settings(derandomize=True, deadline=None, max_examples=300)
@given(
    text=st.text(st.sampled_from("ab1 \n\t.,é<|>"), max_size=200),
    size=st.integers(min_value=1, max_value=20),
)
def test_tokenizing_in_chunks_gives_the_tokens_of_the_whole(text: str, size: int) -> None:
    pieces = chunks(text, size)
    assert "".join(pieces) == text
    whole = WordTokenizer().pieces(text)
    assert [p for chunk in pieces for p in WordTokenizer().pieces(chunk)] == whole


def test_long_texts_are_tokenized_in_chunks_with_the_same_ids() -> None:
    text = "Routing on prefixes needs stable tokens, again and again!\n" * 2000
    assert len(chunks(text)) > 1
    tokenizer = WordTokenizer()
    unchunked = [tokenizer.encode(piece)[0] for piece in _TOKEN_RE.findall(text)]
    assert tokenizer.encode(text) == unchunked
    assert tokenizer.count(text) == len(unchunked)
