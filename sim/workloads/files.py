"""Reading trace files line by line, with errors that name the file and line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sim.workloads.program import TraceFormatError


def check_readable(path: Path) -> None:
    """Fail early, with the path in the message, rather than on the first program."""
    if not path.is_file():
        raise TraceFormatError(path, 0, "no such file (give the path of a trace file)")


def jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line number, decoded JSON)`` for every non-blank line of a JSONL file."""
    check_readable(path)
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(path, number, f"not valid JSON: {exc.msg}") from exc


def require_int(path: Path, line: int, record: dict[str, Any], key: str, minimum: int) -> int:
    """``record[key]`` as an int of at least ``minimum``; bools are not numbers here."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(path, line, f"{key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise TraceFormatError(path, line, f"{key!r} must be at least {minimum}, got {value}")
    return value


def require_object(path: Path, line: int, record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise TraceFormatError(path, line, f"expected a JSON object, got {type(record).__name__}")
    return record
