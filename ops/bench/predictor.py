"""``manage.py bench predictor --trace PATH``: response-length prediction accuracy, PreServe's way.

Reads a ShareGPT file (``sim.workloads.sharegpt``: one example per recorded
assistant reply, its prompt the conversation so far, its truth the reply's
token count), splits it by conversation with a fixed rule (a conversation is in
the test set when ``crc32(session key) % 5 == 0``: about 8:2, as in PreServe
§5.2.2, and the same split on every run and machine) and compares predictors:

* ``none``: no prediction (``max_tokens``, unset in ShareGPT, so the default);
* ``session-mean``: the mean of the conversation's earlier answers;
* ``learned``: ``core.learned_length``, bootstrapped on the training
  conversations (``--passes``), then, as in the balancer, predicting each test
  turn before observing its truth.

Columns: MAE in tokens, Acc-25/50/100 (share of predictions within 25, 50, 100
tokens of the truth: PreServe's Table 2), and microseconds per prediction
(p50/p99, features from the last user message included, tokenization excluded:
the balancer has the token count already).  A last line times the learned
predictor on one 4k-token prompt.  ``--save PATH`` writes the learned model's
state for ``MERIDIAN_LENGTH_PREDICTOR_STATE``.
"""

from __future__ import annotations

import argparse
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from core.length_predictor import (
    LengthPredictor,
    NoPredictor,
    RequestFeatures,
    SessionHistory,
    SessionMeanPredictor,
    last_user_text,
    word_cues,
)
from core.tokenizer import WordTokenizer, render_chat
from sim.workloads.program import ReplyOf
from sim.workloads.sharegpt import ShareGptConversations

TEST_SHARE = 5  # one conversation in five is held out
ACCURACY_WITHIN = (25, 50, 100)


@dataclass(frozen=True, slots=True)
class Example:
    """One recorded turn: what the balancer would know, and the truth."""

    session: str
    prompt_tokens: int
    opening: str
    last_user: str
    actual: int


@dataclass(slots=True)
class Scores:
    name: str
    errors: list[float] = field(default_factory=list)
    micros: list[float] = field(default_factory=list)

    def mae(self) -> float:
        return sum(self.errors) / len(self.errors) if self.errors else 0.0

    def within(self, tokens: int) -> float:
        return sum(e <= tokens for e in self.errors) / len(self.errors) if self.errors else 0.0

    def micros_at(self, share: float) -> float:
        ordered = sorted(self.micros)
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, help="ShareGPT JSON or JSONL file")
    parser.add_argument("--passes", type=int, default=1, help="bootstrap passes (default 1)")
    parser.add_argument("--limit", type=int, default=0, help="use the first N conversations")
    parser.add_argument("--save", default="", help="write the learned model's state here")


def run(options: dict[str, Any], stdout: TextIO) -> None:
    from core.learned_length import LearnedPredictor  # its library loads only here

    examples = list(read_examples(Path(options["trace"]), options["limit"]))
    train = [e for e in examples if not held_out(e.session)]
    test = [e for e in examples if held_out(e.session)]
    if not train or not test:
        raise ValueError("the trace needs conversations on both sides of the split")
    learned = LearnedPredictor()
    predictors: list[LengthPredictor] = [NoPredictor(), SessionMeanPredictor(), learned]
    pairs = training_pairs(train)
    rows = [evaluate(p, pairs, test, passes=options["passes"]) for p in predictors]
    if options["save"]:
        Path(options["save"]).write_bytes(learned.state())
    write_table(stdout, rows, len(train), len(test))
    stdout.write(f"learned, one 4k-token prompt: {time_long_prompt(learned):.1f} us\n")


def held_out(session: str) -> bool:
    return zlib.crc32(session.encode()) % TEST_SHARE == 0


def read_examples(path: Path, limit: int) -> Iterator[Example]:
    tokenizer = WordTokenizer()
    for index, program in enumerate(ShareGptConversations(path).programs()):
        if limit and index >= limit:
            return
        for step in program.steps:
            messages = [
                {"role": m.role, "content": m.content}
                for m in step.messages
                if not isinstance(m.content, ReplyOf)
            ]
            rendered = render_chat(messages)
            yield Example(
                session=program.session_key,
                prompt_tokens=tokenizer.count(rendered),
                opening=rendered[:64],
                last_user=last_user_text(messages),
                actual=step.max_tokens,
            )


def features_of(example: Example, history: SessionHistory) -> RequestFeatures:
    """What the balancer builds: cues from the last user message, the opening's
    identity standing in for the first block key, the session's earlier answers."""
    return RequestFeatures(
        prompt_tokens=example.prompt_tokens,
        system_key=zlib.crc32(example.opening.encode()),
        earlier_outputs=history.earlier(example.session),
        cues=word_cues(example.last_user),
    )


def training_pairs(examples: Sequence[Example]) -> list[tuple[RequestFeatures, int]]:
    history = SessionHistory()
    pairs = []
    for example in examples:
        pairs.append((features_of(example, history), example.actual))
        history.record(example.session, example.actual)
    return pairs


def evaluate(
    predictor: LengthPredictor,
    train: Sequence[tuple[RequestFeatures, int]],
    test: Sequence[Example],
    *,
    passes: int,
) -> Scores:
    """Bootstrap on ``train`` (``passes`` times over; only the learned model
    changes after the first), then predict each test turn before observing it."""
    for _ in range(passes):
        for features, actual in train:
            predictor.observe(features, actual)
    scores = Scores(predictor.name)
    history = SessionHistory()
    for example in test:
        started = time.perf_counter()
        features = features_of(example, history)
        predicted = predictor.predict(features)
        scores.micros.append((time.perf_counter() - started) * 1e6)
        scores.errors.append(abs(predicted - example.actual))
        predictor.observe(features, example.actual)
        history.record(example.session, example.actual)
    return scores


def time_long_prompt(predictor: LengthPredictor, runs: int = 200) -> float:
    """Median microseconds for a 4k-token prompt, features included."""
    text = " ".join(f"word{i % 97}" for i in range(4096))
    history = SessionHistory()
    history.record("s", 120)
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        features = RequestFeatures(
            prompt_tokens=4096,
            system_key=zlib.crc32(text[:64].encode()),
            earlier_outputs=history.earlier("s"),
            cues=word_cues(text),
        )
        predictor.predict(features)
        timings.append((time.perf_counter() - started) * 1e6)
    return sorted(timings)[len(timings) // 2]


def write_table(stdout: TextIO, rows: Sequence[Scores], trained: int, tested: int) -> None:
    stdout.write(f"response-length prediction: {trained} training turns, {tested} test turns\n")
    header = ["predictor", "MAE", *(f"Acc-{n}" for n in ACCURACY_WITHIN), "us p50", "us p99"]
    stdout.write("| " + " | ".join(header) + " |\n")
    stdout.write("|" + "|".join("---" for _ in header) + "|\n")
    for row in rows:
        cells = [
            row.name,
            f"{row.mae():.1f}",
            *(f"{row.within(n):.1%}" for n in ACCURACY_WITHIN),
            f"{row.micros_at(0.5):.1f}",
            f"{row.micros_at(0.99):.1f}",
        ]
        stdout.write("| " + " | ".join(cells) + " |\n")
