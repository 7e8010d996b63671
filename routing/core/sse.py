"""Relay an OpenAI server-sent-event stream event by event, learning its usage.

The balancer always asks replicas for ``stream_options.include_usage`` so it can
count prompt, cached and completion tokens, and must then hide the extra final
chunk (``"choices": []`` with a ``usage`` object, as vLLM and OpenAI send it)
from clients that did not ask for it: an SDK that did not request usage may
index ``choices[0]`` on every chunk.

``SseRelay.feed`` takes raw upstream bytes as they arrive and returns the bytes
to send on now: every complete event, in order, untouched byte for byte, except
a usage-only event when stripping.  Only an incomplete trailing event is held
back, so the buffer is at most one event long and output is never delayed past
the end of the event that produced it.  A peer that never sends an event
boundary cannot make it grow without bound: past ``max_pending`` bytes the
pending text is passed through as is.

Most chunks take a fast path: a chunk that completes every event it holds
(nothing pending before it, an event boundary at its end) and has no
``"usage"`` key with an object value cannot hold the usage event, so it is
returned as it is, without being split into events.  (OpenAI sends
``"usage": null`` on every other chunk once usage is requested, hence the
look at the value; vLLM leaves the key out.)  Only the final chunks of a
stream are split and parsed, with the same output as splitting everything,
which keeps the relay's cost per token small (docs/performance.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_BOUNDARY = (b"\n\n", b"\r\n\r\n", b"\r\r")
# A "usage" key whose value is an object: all a usage event can look like in JSON
# (a nested string mentioning it has its quotes escaped and cannot match).
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def from_openai(cls, usage: Any) -> Usage | None:
        """``usage`` from an OpenAI response or chunk; None when absent or malformed."""
        if not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            cached_tokens=_int(cached),
        )


class SseRelay:
    """Incremental SSE event splitter that records usage and optionally strips it."""

    def __init__(self, *, strip_usage: bool, max_pending: int = 1 << 20) -> None:
        self.strip_usage = strip_usage
        self.max_pending = max_pending
        self.usage: Usage | None = None
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._pending and chunk.endswith(_BOUNDARY) and not _USAGE_OBJECT.search(chunk):
            return chunk  # whole events, none of them the usage event
        data = self._pending + chunk if self._pending else chunk
        out: list[bytes] = []
        start = 0
        while True:
            end, width = _next_boundary(data, start)
            if end < 0:
                break
            event = data[start : end + width]
            start = end + width
            if self._keep(event):
                out.append(event)
        self._pending = data[start:]
        if len(self._pending) > self.max_pending:
            out.append(self._pending)
            self._pending = b""
        return b"".join(out)

    def flush(self) -> bytes:
        """What is left when the upstream closes (an event without its blank line)."""
        rest, self._pending = self._pending, b""
        if rest and not self._keep(rest):
            return b""
        return rest

    def _keep(self, event: bytes) -> bool:
        payload = _data_payload(event)
        if payload is None or not _USAGE_OBJECT.search(payload):
            return True
        try:
            parsed = json.loads(payload)
        except ValueError:
            return True
        if not isinstance(parsed, dict):
            return True
        usage = Usage.from_openai(parsed.get("usage"))
        if usage is None:
            return True
        self.usage = usage
        usage_only = parsed.get("choices") == []
        return not (self.strip_usage and usage_only)


def _next_boundary(data: bytes, start: int) -> tuple[int, int]:
    best, width = -1, 0
    for marker in _BOUNDARY:
        index = data.find(marker, start)
        if index >= 0 and (best < 0 or index < best):
            best, width = index, len(marker)
    return best, width


def _data_payload(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event (SSE spec), or None if it has none."""
    parts = [
        line[5:].lstrip(b" ") if line.startswith(b"data:") else None for line in event.splitlines()
    ]
    data = [p for p in parts if p is not None]
    return b"\n".join(data) if data else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
