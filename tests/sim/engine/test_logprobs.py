"""Emulated logprobs: the engine's own token is the likeliest, and the numbers repeat."""

from __future__ import annotations

import math

from sim.engine.logprobs import chat_logprobs, completion_logprobs, token_logprobs

VOCAB = list(range(100, 140))


def decode(token_id: int) -> str:
    return f" w{token_id}"


def test_the_chosen_token_is_most_likely_and_a_step_sums_below_one() -> None:
    for position in range(50):
        step = token_logprobs("key", position, 107, " w107", 5, VOCAB, decode)
        probabilities = [math.exp(step.logprob)] + [math.exp(lp) for _, lp in step.alternatives]
        assert probabilities == sorted(probabilities, reverse=True)
        assert sum(probabilities) < 1
        assert " w107" not in dict(step.alternatives) and len(step.alternatives) == 5
    again = token_logprobs("key", 3, 107, " w107", 5, VOCAB, decode)
    assert again == token_logprobs("key", 3, 107, " w107", 5, VOCAB, decode)
    assert again != token_logprobs("other", 3, 107, " w107", 5, VOCAB, decode)


def test_chat_and_completions_shapes_match_vllms() -> None:
    steps = [
        token_logprobs("k", i, t, decode(t), 2, VOCAB, decode) for i, t in enumerate((101, 102))
    ]
    chat = chat_logprobs(steps)["content"]
    assert [entry["token"] for entry in chat] == [" w101", " w102"]
    first = chat[0]
    assert first["bytes"] == list(b" w101")
    # vLLM keeps top_logprobs entries, the sampled token first.
    assert len(first["top_logprobs"]) == 2 and first["top_logprobs"][0]["token"] == " w101"
    completion = completion_logprobs(steps, text_offset=4)
    assert completion["tokens"] == [" w101", " w102"]
    assert completion["text_offset"] == [4, 9]
    # Completions: the chosen token plus logprobs=2 alternatives.
    assert [len(top) for top in completion["top_logprobs"]] == [3, 3]
    assert completion["token_logprobs"][0] == completion["top_logprobs"][0][" w101"]
