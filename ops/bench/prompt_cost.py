"""The whole routing decision for one chat request, with a model tokenizer and with the fallback.

A balancer pays, per request and before any response byte: render the chat
template, tokenize, hash the full blocks, and select a replica.  This table
measures each step's CPU time (``time.thread_time_ns``: the work itself, not
what the scheduler does to the process) for chat prompts of about 300, 4k and
32k tokens, for two encoders side by side:

* **model**: a byte-level BPE tokenizer and a Llama-3-style Jinja chat template
  (``ops.bench.model_fixture``, trained offline into a temporary directory), the
  path of a model configured with ``MERIDIAN_MODEL_TOKENIZERS``;
* **fallback**: Meridian's word tokenizer and fixed template.

Every measured request is a fresh conversation (no tokenizer cache can serve it
from an earlier one), selected by the ``cache_map`` policy over 8 replicas.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.bench.model_fixture import write_model_tokenizer
from routing.core.blocks import block_hashes
from routing.core.model_tokenizer import ModelTokenizer
from routing.core.prompts import ChatPrompt, FallbackEncoder, PromptEncoder
from routing.core.registry import build_policy
from routing.core.types import RequestDescriptor, TargetState
from routing.model_tokens import read_tokenizer_files
from sim.workloads.text import WORDS

PROMPT_TOKENS = (300, 4096, 32768)
STEPS = ("template", "tokenize", "hash", "select")


@dataclass(frozen=True, slots=True)
class StepCost:
    """Median CPU microseconds of each step for one encoder and prompt size."""

    encoder: str
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


def words_for(encoder: PromptEncoder, tokens: int, rng: random.Random) -> int:
    """How many filler words make a chat prompt of about ``tokens`` tokens under ``encoder``."""
    probe = ChatPrompt(chat_messages(1000, rng))
    per_word = len(encoder.encode(encoder.render(probe), add_special_tokens=False)) / 1000
    return max(1, round(tokens / per_word))


def model_encoder(directory: Path) -> ModelTokenizer:
    return ModelTokenizer(read_tokenizer_files(str(write_model_tokenizer(directory))))


def measure(
    name: str, encoder: PromptEncoder, tokens: int, runs: int, seed: int
) -> tuple[StepCost, list[int]]:
    rng = random.Random(f"{seed}-{name}-{tokens}")
    words = words_for(encoder, tokens, rng)
    policy = build_policy("cache_map")
    targets = [TargetState(f"replica-{i}", f"http://r{i}.bench") for i in range(8)]
    policy.on_targets_changed([t.target_id for t in targets])
    samples: dict[str, list[float]] = {step: [] for step in STEPS}
    ids: list[int] = []
    for run in range(runs + 1):  # the first run warms up and is dropped
        prompt = ChatPrompt(chat_messages(words, rng))
        text, cost_t = _cpu(lambda p=prompt: encoder.render(p))  # type: ignore[misc]
        ids, cost_k = _cpu(lambda: encoder.encode(text, add_special_tokens=False))
        hashes, cost_h = _cpu(lambda: block_hashes(ids))
        request = RequestDescriptor(f"b{run}", "bench", len(ids), tuple(hashes))
        _, cost_s = _cpu(lambda: policy.select(request, targets))
        if run:
            for step, cost in zip(STEPS, (cost_t, cost_k, cost_h, cost_s), strict=True):
                samples[step].append(cost)
    return StepCost(name, len(ids), {s: _median(v) for s, v in samples.items()}), ids


def prompt_cost_table(runs: int, seed: int) -> tuple[list[str], list[list[str]], list[StepCost]]:
    with tempfile.TemporaryDirectory(prefix="meridian-bench-model-") as tmp:
        encoders: list[tuple[str, PromptEncoder]] = [
            ("model", model_encoder(Path(tmp))),
            ("fallback", FallbackEncoder()),
        ]
        costs = [
            measure(name, encoder, tokens, runs, seed)[0]
            for tokens in PROMPT_TOKENS
            for name, encoder in encoders
        ]
    headers = ["encoder", "tokens", *(f"{s} us" for s in STEPS), "total us"]
    rows = [
        [c.encoder, str(c.tokens), *(f"{c.micros[s]:.0f}" for s in STEPS), f"{c.total:.0f}"]
        for c in costs
    ]
    return headers, rows, costs


def _cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.thread_time_ns()
    value = fn()
    return value, (time.thread_time_ns() - start) / 1000.0


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0
