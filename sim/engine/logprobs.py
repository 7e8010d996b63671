"""Log probabilities for the emulated model's tokens, in vLLM's two response shapes.

The emulated engine samples words uniformly, so it has no distribution to
report; it reports a plausible one instead, built around its own choice: the
token it emitted is the most likely one (probability 0.35 to 0.95), and the
``k`` alternatives are other vocabulary words sharing the rest, each at most
half as likely as the one before.  The probabilities of a step sum to less
than 1, as a top-k slice of a real distribution does.  Everything is derived
from the request's key, the token's position and its id, so the same request
gets the same numbers on every replica and every run.

Chat (``logprobs: true``, ``top_logprobs: k``) answers with ``{"content":
[{token, logprob, bytes, top_logprobs: [k entries]}]}``; completions
(``logprobs: k``) with ``{tokens, token_logprobs, top_logprobs: [{token:
logprob}, k + 1 entries with the chosen one], text_offset}``, as vLLM's
``OpenAIServingChat`` and ``OpenAIServingCompletion`` build them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One generated token: its text and logprob, and the top alternatives'."""

    text: str
    logprob: float
    alternatives: tuple[tuple[str, float], ...]


def token_logprobs(
    key: str,
    position: int,
    token_id: int,
    text: str,
    k: int,
    vocabulary: Sequence[int],
    decode: Callable[[int], str],
) -> TokenLogprobs:
    """The logprobs of the token at ``position`` (``k`` alternatives from ``vocabulary``)."""
    rng = random.Random(f"{key}:{position}:{token_id}")
    chosen = 0.35 + 0.6 * rng.random()
    rest, alternatives = 1.0 - chosen, []
    others = [t for t in rng.sample(vocabulary, min(len(vocabulary), k + 1)) if t != token_id]
    for rank, other in enumerate(others[:k]):
        share = rest * 0.5 ** (rank + 1) * (0.6 + 0.4 * rng.random())
        alternatives.append((decode(other), math.log(share)))
    return TokenLogprobs(text, math.log(chosen), tuple(alternatives))


def chat_logprobs(tokens: Sequence[TokenLogprobs]) -> dict[str, Any]:
    return {"content": [_chat_entry(t) for t in tokens]}


def _chat_entry(token: TokenLogprobs) -> dict[str, Any]:
    top = [{"token": token.text, "logprob": token.logprob, "bytes": _bytes(token.text)}]
    top += [{"token": t, "logprob": lp, "bytes": _bytes(t)} for t, lp in token.alternatives]
    return {
        "token": token.text,
        "logprob": token.logprob,
        "bytes": _bytes(token.text),
        # vLLM lists the sampled token first, then the top-k, and keeps k entries.
        "top_logprobs": top[: len(token.alternatives)],
    }


def completion_logprobs(tokens: Sequence[TokenLogprobs], text_offset: int) -> dict[str, Any]:
    """The completions shape; ``text_offset`` is where the first token's text starts."""
    offsets = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token.text)
    return {
        "text_offset": offsets,
        "token_logprobs": [t.logprob for t in tokens],
        "tokens": [t.text for t in tokens],
        "top_logprobs": [{t.text: t.logprob} | dict(t.alternatives) for t in tokens],
    }


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))
