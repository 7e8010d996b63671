"""What a workload is made of: programs (client sessions) of dependent steps.

A *program* is what one client does in one session: a small DAG of *steps*.  A step
becomes a request only once the steps it waits on have finished, because its
content may quote their replies: the next turn of a conversation carries the
assistant's actual answer in its history, and a tree-of-thought child extends its
parent's prompt with the parent's reply.  Steps whose dependencies finish together
(tree siblings) are sent concurrently.

The same objects drive the HTTP replayer and the discrete-event simulator, so this
module is plain data: no clocks, no I/O.  ``Step.render`` turns a step plus the
replies seen so far into a concrete ``Request``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol


class ApiKind(StrEnum):
    """Which OpenAI endpoint a request goes to."""

    CHAT = "chat"  # POST /v1/chat/completions with messages
    COMPLETION = "completion"  # POST /v1/completions with a prompt


@dataclass(frozen=True, slots=True)
class ReplyOf:
    """Placeholder for the reply text of an earlier step of the same program."""

    step: int


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message; ``content`` is literal text or an earlier step's reply."""

    role: str
    content: str | ReplyOf


@dataclass(frozen=True, slots=True)
class Request:
    """A step made concrete: everything needed to send it."""

    kind: ApiKind
    max_tokens: int
    ignore_eos: bool
    session_key: str
    messages: tuple[dict[str, str], ...] = ()
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class Step:
    """One request of a program, possibly waiting for earlier steps.

    ``after`` lists the steps (indices into the program) that must finish first;
    every ``ReplyOf`` in ``messages`` must name one of them or one of theirs.  Indices in ``after``
    are always smaller than the step's own index, so program order is a valid
    topological order.
    """

    kind: ApiKind
    max_tokens: int
    ignore_eos: bool = False
    messages: tuple[Message, ...] = ()
    prompt: str = ""
    after: tuple[int, ...] = ()

    def render(self, replies: Mapping[int, str], session_key: str) -> Request:
        """The concrete request, with every ``ReplyOf`` replaced by that step's reply."""
        messages = tuple(
            {"role": m.role, "content": _resolve(m.content, replies)} for m in self.messages
        )
        return Request(
            kind=self.kind,
            max_tokens=self.max_tokens,
            ignore_eos=self.ignore_eos,
            session_key=session_key,
            messages=messages,
            prompt=self.prompt,
        )


def _resolve(content: str | ReplyOf, replies: Mapping[int, str]) -> str:
    if isinstance(content, ReplyOf):
        return replies[content.step]
    return content


@dataclass(frozen=True, slots=True)
class Program:
    """One client session: its steps, its session key, and when it starts.

    ``start`` is the offset in seconds from the start of the replay at which the
    trace (or generator) says the session begins; open-loop Poisson arrivals and
    closed-loop clients override it.
    """

    program_id: int
    session_key: str
    steps: tuple[Step, ...]
    start: float = 0.0

    def __post_init__(self) -> None:
        # A step may quote any step it waits on directly or through others (a tree
        # node quotes every reply on its path), never one that may not be done yet.
        done_before: list[set[int]] = []
        for index, step in enumerate(self.steps):
            ancestors: set[int] = set()
            for dep in step.after:
                if not 0 <= dep < index:
                    raise ValueError(f"step {index} waits on step {dep}, which is not before it")
                ancestors |= {dep, *done_before[dep]}
            for message in step.messages:
                if isinstance(message.content, ReplyOf) and message.content.step not in ancestors:
                    raise ValueError(
                        f"step {index} quotes step {message.content.step} without waiting for it"
                    )
            done_before.append(ancestors)

    def roots(self) -> list[int]:
        """Steps that can be sent as soon as the program starts."""
        return [i for i, step in enumerate(self.steps) if not step.after]


class Workload(Protocol):
    """A named, seeded source of programs.

    ``timed`` says whether the programs carry their own arrival offsets (a trace
    with timestamps); otherwise the replayer chooses arrivals (Poisson or closed
    loop).  ``programs()`` starts afresh each call and yields the same sequence for
    the same seed; synthetic workloads are endless, traces end with the file.
    """

    name: str
    timed: bool

    def programs(self) -> Iterator[Program]: ...


class TraceFormatError(ValueError):
    """A trace file that cannot be read, naming the file and line to look at."""

    def __init__(self, path: Path | str, line: int, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line else str(self.path)
        super().__init__(f"{where}: {reason}")
