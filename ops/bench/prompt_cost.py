"""The whole routing decision for one chat request, with a model tokenizer and with the fallback.

A balancer pays, per request and before any response byte: render the chat
template, tokenize, hash the full blocks, and select a replica.  This table
measures each step's CPU time (``time.process_time_ns``: the work itself, not
what the scheduler does to the process, and including the Rust tokenizer's own
worker threads, which a batch of several segments may use) for chat prompts of
about 300, 4k and 32k tokens, for two encoders side by side:

* **model**: a byte-level BPE tokenizer and a Llama-3-style Jinja chat template
  (``ops.bench.model_fixture``, trained offline into a temporary directory), the
  path of a model configured with ``MERIDIAN_MODEL_TOKENIZERS``;
* **fallback**: Meridian's word tokenizer and fixed template.

Each size has two rows per encoder, both selected by the ``cache_map`` policy
over 8 replicas:

* **fresh**: a new conversation (a system prompt and a user message), whose
  text no earlier request had, so the segment cache (``core.segments``)
  cannot serve any of it;
* **follow-up**: that conversation's next turn, the assistant's ~100-token
  answer and a new ~100-token user message appended, measured right after the
  first turn went through the same encoder, as a chat client sends it.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.blocks import block_hashes
from core.model_tokenizer import ModelTokenizer
from core.policy import Policy
from core.prompts import ChatPrompt, FallbackEncoder, PromptEncoder
from core.registry import build_policy
from core.types import RequestDescriptor, TargetState
from ops.bench.model_fixture import write_model_tokenizer
from routing.model_tokens import read_tokenizer_files
from sim.workloads.text import WORDS

PROMPT_TOKENS = (300, 4096, 32768)
STEPS = ("template", "tokenize", "hash", "select")
TURNS = ("fresh", "follow-up")
FOLLOW_UP_TOKENS = 100  # each of the two messages a follow-up turn appends


@dataclass(frozen=True, slots=True)
class StepCost:
    """Median CPU microseconds of each step for one encoder and prompt size."""

    encoder: str
    turn: str
    tokens: int
    micros: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.micros.values())


def chat_messages(words: int, rng: random.Random) -> list[dict[str, Any]]:
    """A system prompt and a user turn of English-like text, ``words`` words in all."""
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    cut = min(len(text) // 4, 2000)
    return [
        {"role": "system", "content": text[:cut].capitalize() + "."},
        {"role": "user", "content": text[cut:].capitalize() + "?"},
    ]


def follow_up(
    messages: list[dict[str, Any]], words: int, rng: random.Random
) -> list[dict[str, Any]]:
    """The conversation's next turn: an assistant answer and a new user message."""

    def text() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize()

    return [*messages, {"role": "assistant", "content": text() + "."},
            {"role": "user", "content": text() + "?"}]  # fmt: skip


def words_for(encoder: PromptEncoder, tokens: int, rng: random.Random) -> int:
    """How many filler words make a chat prompt of about ``tokens`` tokens under ``encoder``."""
    probe = ChatPrompt(chat_messages(1000, rng))
    per_word = len(encoder.encode(encoder.render(probe), add_special_tokens=False)) / 1000
    return max(1, round(tokens / per_word))


def model_encoder(directory: Path) -> ModelTokenizer:
    return ModelTokenizer(read_tokenizer_files(str(write_model_tokenizer(directory))))


def measure(
    name: str, encoder: PromptEncoder, tokens: int, runs: int, seed: int
) -> tuple[StepCost, StepCost]:
    """The fresh and the follow-up row of one encoder and prompt size."""
    rng = random.Random(f"{seed}-{name}-{tokens}")
    words = words_for(encoder, tokens, rng)
    turn_words = words_for(encoder, FOLLOW_UP_TOKENS, rng)
    policy = build_policy("cache_map")
    targets = [TargetState(f"replica-{i}", f"http://r{i}.bench") for i in range(8)]
    policy.on_targets_changed([t.target_id for t in targets])
    samples = {turn: {step: list[float]() for step in STEPS} for turn in TURNS}
    sizes = dict.fromkeys(TURNS, 0)
    for run in range(runs + 1):  # the first run warms up and is dropped
        first = chat_messages(words, rng)
        second = follow_up(first, turn_words, rng)
        for turn, messages in zip(TURNS, (first, second), strict=True):
            costs, sizes[turn] = decide(encoder, ChatPrompt(messages), policy, targets, run)
            if run:
                for step, cost in zip(STEPS, costs, strict=True):
                    samples[turn][step].append(cost)
    fresh, second_turn = (
        StepCost(name, turn, sizes[turn], {s: _median(v) for s, v in samples[turn].items()})
        for turn in TURNS
    )
    return fresh, second_turn


def decide(
    encoder: PromptEncoder,
    prompt: ChatPrompt,
    policy: Policy,
    targets: list[TargetState],
    run: int,
) -> tuple[tuple[float, ...], int]:
    """CPU microseconds of each step of one routing decision, and the prompt's tokens."""
    text, cost_t = _cpu(lambda: encoder.render(prompt))
    ids, cost_k = _cpu(lambda: encoder.encode(text, add_special_tokens=False))
    hashes, cost_h = _cpu(lambda: block_hashes(ids))
    request = RequestDescriptor(f"b{run}-{len(ids)}", "bench", len(ids), tuple(hashes))
    _, cost_s = _cpu(lambda: policy.select(request, targets))
    return (cost_t, cost_k, cost_h, cost_s), len(ids)


def prompt_cost_table(runs: int, seed: int) -> tuple[list[str], list[list[str]], list[StepCost]]:
    with tempfile.TemporaryDirectory(prefix="meridian-bench-model-") as tmp:
        encoders: list[tuple[str, PromptEncoder]] = [
            ("model", model_encoder(Path(tmp))),
            ("fallback", FallbackEncoder()),
        ]
        costs = [
            cost
            for tokens in PROMPT_TOKENS
            for name, encoder in encoders
            for cost in measure(name, encoder, tokens, runs, seed)
        ]
    headers = ["encoder", "turn", "tokens", *(f"{s} us" for s in STEPS), "total us"]
    rows = [
        [c.encoder, c.turn, str(c.tokens), *(f"{c.micros[s]:.0f}" for s in STEPS),
         f"{c.total:.0f}"]
        for c in costs
    ]  # fmt: skip
    return headers, rows, costs


def _cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.process_time_ns()
    value = fn()
    return value, (time.process_time_ns() - start) / 1000.0


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0
