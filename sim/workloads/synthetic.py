"""Built-in synthetic workloads: no data files, deterministic for a seed.

Three shapes that exercise prefix-aware routing the way SkyLB's evaluation does:

* ``conversations``: multi-turn chats.  Each program is one user's conversation;
  turn *t* resends the system prompt, every earlier user message and the assistant's
  *actual* earlier replies, then a new user message, so the history grows and the
  whole previous turn is a reusable prefix.  Users are spread over a few long system
  prompts, so different users share those too.
* ``system-prompts``: single-turn requests from many users, each behind one of a
  few long system prompts (an "app" prompt shared by everyone using that app).
* ``tot``: tree-of-thought.  A root question, then ``branching`` children per node
  down to ``depth`` levels (1 + b + b^2 + ... + b^(depth-1) requests: 15 for b=2 and
  85 for b=4 at depth 4).  A child's messages are its parent's messages plus the
  parent's reply plus a short "explore option i" instruction, so every node shares
  its whole path as a prefix, and siblings are sent concurrently.

Lengths are in tokens of the shared ``WordTokenizer`` and are exact for message
contents (the chat template adds a few tokens per message on top).  Each program is
generated from its own seeded RNG, so program *k* is the same whatever was asked
before it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from sim.workloads.program import ApiKind, Message, Program, ReplyOf, Step
from sim.workloads.text import seeded, tagged_text, word_text


def shared_system_texts(seed: int, count: int, tokens: int) -> tuple[str, ...]:
    """The long system prompts that several users share (one cacheable prefix each)."""
    return tuple(word_text(seeded("system", seed, s), tokens) for s in range(count))


def _check_range(name: str, low: int, high: int, *, minimum: int = 1) -> None:
    if low < minimum or high < low:
        raise ValueError(f"{name}: need {minimum} <= min <= max, got {low}..{high}")


@dataclass(frozen=True)
class ConversationsConfig:
    seed: int = 0
    system_prompts: int = 4
    system_tokens: int = 1024
    users: int = 32
    turns_min: int = 2
    turns_max: int = 6
    user_tokens_min: int = 32
    user_tokens_max: int = 192
    max_tokens_min: int = 32
    max_tokens_max: int = 160
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_range("system_prompts", 1, self.system_prompts)
        _check_range("users", self.system_prompts, self.users)
        _check_range("turns", self.turns_min, self.turns_max)
        _check_range("user_tokens", self.user_tokens_min, self.user_tokens_max)
        _check_range("max_tokens", self.max_tokens_min, self.max_tokens_max)


class Conversations:
    """Multi-turn conversations with growing history over shared system prompts."""

    name = "conversations"
    timed = False

    def __init__(self, config: ConversationsConfig | None = None) -> None:
        self.config = config or ConversationsConfig()

    @cached_property
    def system_texts(self) -> tuple[str, ...]:
        return shared_system_texts(
            self.config.seed, self.config.system_prompts, self.config.system_tokens
        )

    def programs(self) -> Iterator[Program]:
        return (self.program(k) for k in itertools.count())

    def program(self, k: int) -> Program:
        c = self.config
        rng = seeded(self.name, c.seed, k)
        user = rng.randrange(c.users)
        # Users are dealt round-robin over system prompts: users // system_prompts share each.
        history: list[Message] = [Message("system", self.system_texts[user % c.system_prompts])]
        steps: list[Step] = []
        for turn in range(rng.randint(c.turns_min, c.turns_max)):
            if turn:
                history.append(Message("assistant", ReplyOf(turn - 1)))
            tokens = rng.randint(c.user_tokens_min, c.user_tokens_max)
            history.append(Message("user", tagged_text(f"u{user}c{k}t{turn}", rng, tokens)))
            steps.append(
                Step(
                    kind=ApiKind.CHAT,
                    max_tokens=rng.randint(c.max_tokens_min, c.max_tokens_max),
                    ignore_eos=c.ignore_eos,
                    messages=tuple(history),
                    after=(turn - 1,) if turn else (),
                )
            )
        return Program(program_id=k, session_key=f"user-{user}", steps=tuple(steps))


@dataclass(frozen=True)
class SystemPromptsConfig:
    seed: int = 0
    system_prompts: int = 4
    system_tokens: int = 1024
    users: int = 200
    question_tokens_min: int = 16
    question_tokens_max: int = 128
    max_tokens_min: int = 16
    max_tokens_max: int = 128
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_range("system_prompts", 1, self.system_prompts)
        _check_range("users", self.system_prompts, self.users)
        _check_range("question_tokens", self.question_tokens_min, self.question_tokens_max)
        _check_range("max_tokens", self.max_tokens_min, self.max_tokens_max)


class SystemPrompts:
    """Single-turn questions from many users behind a few long shared system prompts."""

    name = "system-prompts"
    timed = False

    def __init__(self, config: SystemPromptsConfig | None = None) -> None:
        self.config = config or SystemPromptsConfig()

    @cached_property
    def system_texts(self) -> tuple[str, ...]:
        return shared_system_texts(
            self.config.seed, self.config.system_prompts, self.config.system_tokens
        )

    def programs(self) -> Iterator[Program]:
        return (self.program(k) for k in itertools.count())

    def program(self, k: int) -> Program:
        c = self.config
        rng = seeded(self.name, c.seed, k)
        user = rng.randrange(c.users)
        tokens = rng.randint(c.question_tokens_min, c.question_tokens_max)
        messages = (
            Message("system", self.system_texts[user % c.system_prompts]),
            Message("user", tagged_text(f"u{user}q{k}", rng, tokens)),
        )
        step = Step(
            kind=ApiKind.CHAT,
            max_tokens=rng.randint(c.max_tokens_min, c.max_tokens_max),
            ignore_eos=c.ignore_eos,
            messages=messages,
        )
        return Program(program_id=k, session_key=f"user-{user}", steps=(step,))


@dataclass(frozen=True)
class TreeOfThoughtConfig:
    seed: int = 0
    branching: int = 2
    depth: int = 4
    system_tokens: int = 256
    question_tokens_min: int = 64
    question_tokens_max: int = 256
    instruction_tokens: int = 12
    max_tokens_min: int = 32
    max_tokens_max: int = 96
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_range("branching", 1, self.branching)
        _check_range("depth", 1, self.depth)
        _check_range("question_tokens", self.question_tokens_min, self.question_tokens_max)
        _check_range("max_tokens", self.max_tokens_min, self.max_tokens_max)
        _check_range("instruction_tokens", 1, self.instruction_tokens)

    @property
    def tree_size(self) -> int:
        return sum(self.branching**level for level in range(self.depth))


class TreeOfThought:
    """Tree-of-thought programs: children extend the parent's prompt and reply."""

    name = "tot"
    timed = False

    def __init__(self, config: TreeOfThoughtConfig | None = None) -> None:
        self.config = config or TreeOfThoughtConfig()

    @cached_property
    def system_text(self) -> str:
        return word_text(seeded("tot-system", self.config.seed), self.config.system_tokens)

    def programs(self) -> Iterator[Program]:
        return (self.program(k) for k in itertools.count())

    def program(self, k: int) -> Program:
        c = self.config
        rng = seeded(self.name, c.seed, k)
        question = tagged_text(
            f"tree{k}", rng, rng.randint(c.question_tokens_min, c.question_tokens_max)
        )
        root = (Message("system", self.system_text), Message("user", question))
        steps = [self._step(rng, root, after=())]
        # Breadth-first, so a parent's index is always below its children's.
        frontier = [0]
        for _ in range(c.depth - 1):
            next_frontier = []
            for parent in frontier:
                for branch in range(c.branching):
                    instruction = tagged_text(f"option{branch}", rng, c.instruction_tokens)
                    messages = (
                        *steps[parent].messages,
                        Message("assistant", ReplyOf(parent)),
                        Message("user", instruction),
                    )
                    next_frontier.append(len(steps))
                    steps.append(self._step(rng, messages, after=(parent,)))
            frontier = next_frontier
        return Program(program_id=k, session_key=f"tree-{k}", steps=tuple(steps))

    def _step(
        self, rng: random.Random, messages: tuple[Message, ...], after: tuple[int, ...]
    ) -> Step:
        c = self.config
        return Step(
            kind=ApiKind.CHAT,
            max_tokens=rng.randint(c.max_tokens_min, c.max_tokens_max),
            ignore_eos=c.ignore_eos,
            messages=messages,
            after=after,
        )
