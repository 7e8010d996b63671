"""ShareGPT conversations (JSON array or JSONL of ``{"conversations": [...]}``).

Each record becomes one program, one step per recorded assistant reply that
answers a user turn.  The step's messages are the conversation *as recorded* up to
that point (earlier ``gpt`` replies included verbatim), so prompts, and the
prefixes consecutive turns share, are those of the real conversation.  The
recorded reply's token count (``WordTokenizer``) becomes ``max_tokens`` with
``ignore_eos``, so the replica generates the recorded length.  Turns still run in
order (each waits for the previous one), as the person did.

Roles: ``human``/``user`` → user, ``gpt``/``chatgpt``/``bard``/``assistant`` →
assistant, ``system`` → system.  Records with no user turn answered by the
assistant yield no program.  ShareGPT has no timestamps and no user ids: the
session key is per conversation and arrivals come from ``--rate``/``--clients``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.tokenizer import WordTokenizer
from sim.workloads.files import check_readable, jsonl_records, require_object
from sim.workloads.program import ApiKind, Message, Program, Step, TraceFormatError

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}


class ShareGptConversations:
    """Programs from a ShareGPT file: recorded multi-turn conversations."""

    name = "sharegpt"
    timed = False

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._tokenizer = WordTokenizer()

    def programs(self) -> Iterator[Program]:
        index = 0
        for where, raw in self._records():
            program = self._program(index, where, require_object(self.path, where, raw))
            if program is not None:
                yield program
                index += 1

    def _records(self) -> Iterator[tuple[int, Any]]:
        """``(line, record)`` pairs from either a JSONL file or one JSON array."""
        check_readable(self.path)
        text = self.path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            yield from self._array_records(text)
        else:
            yield from jsonl_records(self.path)

    def _array_records(self, text: str) -> Iterator[tuple[int, Any]]:
        # Decoding element by element keeps each record's line number for errors.
        decoder = json.JSONDecoder()
        position = text.index("[") + 1
        while True:
            position = _skip_space(text, position)
            if text.startswith("]", position):
                return
            line = text.count("\n", 0, position) + 1
            try:
                record, position = decoder.raw_decode(text, position)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(self.path, exc.lineno, f"not valid JSON: {exc.msg}") from exc
            yield line, record
            position = _skip_space(text, position)
            if text.startswith(",", position):
                position += 1
            elif not text.startswith("]", position):
                line = text.count("\n", 0, position) + 1
                raise TraceFormatError(self.path, line, "expected ',' or ']' between records")

    def _messages(self, where: int, record: dict[str, Any]) -> list[Message]:
        turns = record.get("conversations")
        if not isinstance(turns, list):
            raise TraceFormatError(self.path, where, "'conversations' must be a list")
        messages = []
        for turn in turns:
            if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
                raise TraceFormatError(
                    self.path, where, f"each turn needs 'from' and a string 'value': {turn!r:.80}"
                )
            role = ROLES.get(str(turn.get("from", "")).lower())
            if role is None:
                raise TraceFormatError(self.path, where, f"unknown speaker {turn.get('from')!r}")
            messages.append(Message(role, turn["value"]))
        return messages

    def _program(self, index: int, where: int, record: dict[str, Any]) -> Program | None:
        messages = self._messages(where, record)
        steps: list[Step] = []
        for position, message in enumerate(messages):
            if message.role != "assistant" or position == 0:
                continue
            if messages[position - 1].role != "user":
                continue
            reply = str(message.content)
            steps.append(
                Step(
                    kind=ApiKind.CHAT,
                    messages=tuple(messages[:position]),
                    max_tokens=max(1, self._tokenizer.count(reply)),
                    ignore_eos=True,
                    after=(len(steps) - 1,) if steps else (),
                )
            )
        if not steps:
            return None
        conversation = record.get("id") or record.get("conversation_id") or f"{index}"
        return Program(program_id=index, session_key=f"sharegpt-{conversation}", steps=tuple(steps))


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position
