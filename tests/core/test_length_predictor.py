"""Response-length prediction (PreServe §4.2): features, the simple predictors, and
the learned one learning a relation it can see."""

from __future__ import annotations

import math
import pickle
import random
import re
import zlib

import pytest
from river import linear_model, optim

from core.learned_length import LearnedPredictor, adagrad_learn_one, encode
from core.length_predictor import (
    DEFAULT_OUTPUT_TOKENS,
    NoPredictor,
    OraclePredictor,
    RequestFeatures,
    SessionHistory,
    SessionMeanPredictor,
    prompt_features,
    word_cues,
)
from core.prompts import ChatPrompt, TextPrompt, TokenPrompt


def test_word_cues_read_both_ends_of_a_long_message_only() -> None:
    middle = " filler" * 10_000
    long = "Translate this" + middle + " into French"
    cues = word_cues(long)
    assert word_cues("translate THIS")[:2] == cues[:2]  # lower-cased head words
    assert cues[-2:] == word_cues("x" * 300 + " into french")[-2:]
    # The middle is never read: changing it leaves the cues as they are.
    changed = long[:1000] + long[1000:-1000].replace("filler", "others") + long[-1000:]
    assert word_cues(changed) == cues


def _cues_read_whole(text: str, chars: int, words: int) -> tuple[int, ...]:
    """``word_cues`` as first written: both windows scanned in full, every time."""
    lowered = text.lower()
    pattern = re.compile(r"[a-z0-9]+|[^\sa-z0-9]")
    head = pattern.findall(lowered[:chars])[:words]
    tail = pattern.findall(lowered[-chars:])[-words:] if len(lowered) > chars else []
    return tuple(
        [zlib.crc32(f"h:{word}".encode()) for word in head]
        + [zlib.crc32(f"t:{word}".encode()) for word in tail]
    )


def test_word_cues_from_a_short_window_equal_those_of_the_whole_window() -> None:
    # Saved models keep their meaning only if the cues stay the same hashes.
    rng = random.Random(5)
    letters = "abcXYZ09 \t\n.,!?-_()`" + "aaaa    "
    for _ in range(3000):
        size = rng.choice([0, 1, 40, 95, 96, 97, 200, 239, 240, 241, 400, 3000])
        text = "".join(rng.choice(letters) for _ in range(size))
        if rng.random() < 0.1:
            text += "İΣ"  # lower case changes the length: read whole
        for chars, words in ((240, 12), (100, 3), (96, 12), (50, 1), (240, 0)):
            assert word_cues(text, chars=chars, words=words) == _cues_read_whole(text, chars, words)


def test_head_and_tail_words_hash_apart() -> None:
    short = word_cues("list")
    tail_only = word_cues("y" * 300 + " list")
    assert short[0] not in tail_only[-1:]


def test_prompt_features_take_the_last_user_message() -> None:
    chat = ChatPrompt(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": [{"type": "text", "text": "second question"}]},
        ]
    )
    assert prompt_features(chat, "chat").cues == word_cues("second question")
    assert prompt_features(TextPrompt("write a poem"), "completions").cues == word_cues(
        "write a poem"
    )
    assert prompt_features(TokenPrompt((1, 2, 3)), "completions").cues == ()


def test_no_predictor_takes_max_tokens_else_the_default() -> None:
    predictor = NoPredictor()
    assert predictor.predict(RequestFeatures(100, max_tokens=64)) == 64
    assert predictor.predict(RequestFeatures(100)) == DEFAULT_OUTPUT_TOKENS


def test_oracle_knows_the_truth_and_falls_back_without_it() -> None:
    oracle = OraclePredictor()
    assert oracle.predict(RequestFeatures(100, max_tokens=500, oracle_output=42)) == 42
    assert oracle.predict(RequestFeatures(100, max_tokens=30, oracle_output=42)) == 30
    assert oracle.predict(RequestFeatures(100, max_tokens=77)) == 77


def test_session_mean_uses_the_session_then_everything_seen() -> None:
    predictor = SessionMeanPredictor()
    assert predictor.predict(RequestFeatures(10)) == DEFAULT_OUTPUT_TOKENS
    predictor.observe(RequestFeatures(10), 100)
    predictor.observe(RequestFeatures(10), 300)
    assert predictor.predict(RequestFeatures(10)) == 200
    assert predictor.predict(RequestFeatures(10, earlier_outputs=(10, 30))) == 20


def test_session_history_is_bounded_in_turns_and_sessions() -> None:
    history = SessionHistory(max_sessions=2, turns=3)
    for tokens in (1, 2, 3, 4):
        history.record("a", tokens)
    history.record("b", 9)
    assert history.earlier("a") == (2, 3, 4)
    history.record("c", 7)  # "a" is the least recently seen
    assert history.earlier("a") == ()
    assert history.earlier("b") == (9,)
    history.record("", 5)  # no session key: nothing to remember
    assert len(history) == 2


def _relation(rng: random.Random) -> tuple[RequestFeatures, int]:
    """Requests that ask to "summarize" get short answers, "essay" ones long answers."""
    if rng.random() < 0.5:
        return RequestFeatures(rng.randint(50, 500), cues=word_cues("summarize this")), 30
    return RequestFeatures(rng.randint(50, 500), cues=word_cues("write an essay")), 600


def test_learned_predictor_learns_what_the_words_say() -> None:
    rng = random.Random(7)
    predictor = LearnedPredictor()
    predictor.fit([_relation(rng) for _ in range(3000)])
    short = predictor.predict(RequestFeatures(200, cues=word_cues("summarize this")))
    long = predictor.predict(RequestFeatures(200, cues=word_cues("write an essay")))
    assert short < 60
    assert long > 400


def test_learned_predictor_starts_at_the_default_and_respects_max_tokens() -> None:
    predictor = LearnedPredictor()
    assert predictor.predict(RequestFeatures(100)) == pytest.approx(DEFAULT_OUTPUT_TOKENS)
    assert predictor.predict(RequestFeatures(100, max_tokens=16)) == 16


def test_learned_state_round_trips_and_refuses_other_bytes() -> None:
    rng = random.Random(3)
    predictor = LearnedPredictor()
    predictor.fit([_relation(rng) for _ in range(500)])
    features = RequestFeatures(200, cues=word_cues("write an essay"))
    restored = LearnedPredictor.from_state(predictor.state())
    assert restored.predict(features) == predictor.predict(features)
    with pytest.raises(ValueError, match="not a saved length predictor"):
        LearnedPredictor.from_state(b"not a model")


def _varied(rng: random.Random) -> tuple[RequestFeatures, int]:
    """Features that touch every encoded field: sessions, system prompts, max_tokens."""
    earlier = tuple(rng.randint(1, 900) for _ in range(rng.randint(0, 5)))
    text = " ".join(
        rng.choice(["list", "why", "code", "essay", "translate", "tl;dr"]) for _ in range(30)
    )
    features = RequestFeatures(
        rng.randint(1, 8000),
        max_tokens=rng.choice([None, 64, 1024]),
        endpoint=rng.choice(["chat", "completions"]),
        system_key=rng.choice([0, rng.getrandbits(63)]),
        earlier_outputs=earlier,
        cues=word_cues(text),
    )
    return features, rng.choice([0, 1, rng.randint(2, 3000), 40_000])


def test_learning_step_is_river_learn_one_bit_for_bit() -> None:
    """The predictor's own AdaGrad step leaves the weights, the optimiser's state and
    the saved bytes exactly as river's ``learn_one`` does, and predicts the same."""
    rng = random.Random(11)
    examples = [_varied(rng) for _ in range(3000)]
    ours = LearnedPredictor()
    theirs = LearnedPredictor()
    for features, actual in examples:
        ours.observe(features, actual)
        ratio = math.log1p(actual) - theirs.baseline(features)
        theirs.model.learn_one(encode(features), ratio)
        theirs.observed += 1
        theirs.observed_tokens += actual
    assert ours.state() == theirs.state()
    assert ours.model.optimizer.n_iterations == 3000
    assert ours.model.weights == theirs.model.weights
    assert [ours.predict(f) for f, _ in examples] == [theirs.predict(f) for f, _ in examples]
    # The saved model is river's own object, loadable and learning on as before.
    restored = LearnedPredictor.from_state(ours.state())
    assert isinstance(pickle.loads(ours.state())[0], linear_model.LinearRegression)
    restored.observe(*examples[0])
    theirs.observe(*examples[0])
    assert restored.state() == theirs.state()


def test_a_model_the_step_does_not_reproduce_learns_through_river() -> None:
    rng = random.Random(5)
    examples = [_varied(rng) for _ in range(200)]
    model = linear_model.LinearRegression(optimizer=optim.AdaGrad(0.02), l2=0.01)
    predictor = LearnedPredictor.from_state(pickle.dumps((model, 0, 0)))
    reference = linear_model.LinearRegression(optimizer=optim.AdaGrad(0.02), l2=0.01)
    unchanged = LearnedPredictor.from_state(pickle.dumps((reference, 0, 0)))
    for features, actual in examples:
        predictor.observe(features, actual)
        ratio = math.log1p(actual) - unchanged.baseline(features)
        unchanged.model.learn_one(encode(features), ratio)
        unchanged.observed += 1
        unchanged.observed_tokens += actual
    assert predictor.state() == unchanged.state()
    # With l2 the shortcut's maths would differ from river's: hence the fallback.
    shortcut = linear_model.LinearRegression(optimizer=optim.AdaGrad(0.02), l2=0.01)
    river = linear_model.LinearRegression(optimizer=optim.AdaGrad(0.02), l2=0.01)
    for features, _ in examples[:50]:
        adagrad_learn_one(shortcut, encode(features), 0.7)
        river.learn_one(encode(features), 0.7)
    assert shortcut.weights != river.weights
