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

Only bytes that hold a ``"usage"`` key with an object value can hold the usage
event, so everything else is never split into events: the relay finds where the
last complete event ends (one ``rfind`` per framing), sends everything before
it on as it is and keeps the rest.  (OpenAI sends ``"usage": null`` on every
other chunk once usage is requested, hence the look at the value; vLLM leaves
the key out.)  Only the read that ends a stream is split, by one regular
expression, and only the events in it that hold a ``"usage"`` key are parsed,
which keeps the relay's cost per token small however many events one read
coalesced (docs/performance.md).
"""

from __future__ import annotations

import bisect
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_BOUNDARY = (b"\n\n", b"\r\n\r\n", b"\r\r")
# Events end at the earliest boundary after their start, of whichever framing:
# the leftmost match of the alternation, resumed after it (at one position at most
# one of the three can match).
_BOUNDARIES = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_USAGE_KEY = re.compile(rb'"usage"')
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
        """``usage`` from an OpenAI response or chunk; None when absent or malformed.

        The Responses API spells the same counts ``input_tokens``, ``output_tokens``
        and ``input_tokens_details``."""
        if not isinstance(usage, dict):
            return None
        if "prompt_tokens" not in usage and "input_tokens" in usage:
            prompt, completion, details_key = (
                "input_tokens",
                "output_tokens",
                "input_tokens_details",
            )
        else:
            prompt, completion, details_key = (
                "prompt_tokens",
                "completion_tokens",
                "prompt_tokens_details",
            )
        details = usage.get(details_key)
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(
            prompt_tokens=_int(usage.get(prompt)),
            completion_tokens=_int(usage.get(completion)),
            cached_tokens=_int(cached),
        )

    @classmethod
    def from_body(cls, body: Any) -> Usage | None:
        """The usage of a whole answer or of one stream event: top-level ``usage``, or
        the ``response.usage`` of a Responses API ``response.completed`` event."""
        if not isinstance(body, dict):
            return None
        found = cls.from_openai(body.get("usage"))
        response = body.get("response")
        if found is None and isinstance(response, dict):
            found = cls.from_openai(response.get("usage"))
        return found


class SseRelay:
    """Incremental SSE event splitter that records usage and optionally strips it."""

    def __init__(self, *, strip_usage: bool, max_pending: int = 1 << 20) -> None:
        self.strip_usage = strip_usage
        self.max_pending = max_pending
        self.usage: Usage | None = None
        self._pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        if data.endswith(_BOUNDARY):  # the usual read: whole events
            complete, self._pending = data, b""
        else:
            cut = _end_of_last_event(data)
            complete, self._pending = data[:cut], data[cut:]
        if _USAGE_OBJECT.search(complete):
            complete = self._filter(complete)
        if len(self._pending) > self.max_pending:
            complete += self._pending
            self._pending = b""
        return complete

    def _filter(self, data: bytes) -> bytes:
        """``data`` (whole events) without the usage event if stripping.  Only events
        holding a ``"usage"`` key are found and parsed (``_keep``); everything else,
        stray bytes after the last boundary included, passes as it is, uncopied if
        nothing is dropped."""
        keys = [match.start() for match in _USAGE_KEY.finditer(data)]
        if not keys:
            return data
        span_of = _event_spans(data)
        out: list[bytes] = []
        kept_from = last_end = 0
        for key in keys:
            if key < last_end:
                continue  # in the event just checked
            span = span_of(key)
            if span is None:
                break  # in the stray bytes after the last boundary
            start, last_end = span
            if not self._keep(data[start:last_end]):
                out.append(data[kept_from:start])
                kept_from = last_end
        if not out:
            return data
        out.append(data[kept_from:])
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
        usage = Usage.from_body(parsed)
        if usage is None:
            return True
        self.usage = usage
        usage_only = parsed.get("choices") == []
        return not (self.strip_usage and usage_only)


def _end_of_last_event(data: bytes) -> int:
    """Where the last complete event of ``data`` ends (0: none is complete)."""
    ends = [index + len(marker) for marker in _BOUNDARY if (index := data.rfind(marker)) >= 0]
    return max(ends, default=0)


Span = tuple[int, int]


def _event_spans(data: bytes) -> Callable[[int], Span | None]:
    """Where the event holding a position starts and ends (None: after the last
    boundary).  Events end at the earliest boundary after their start, so with only
    ``\\n`` framing (what vLLM and OpenAI send) the answer is found from the position
    backwards (``_lf_event_span``); a stream with ``\\r`` in it is split from the
    start, by one regular expression."""
    if b"\r" not in data:
        return functools.partial(_lf_event_span, data)
    ends = [match.end() for match in _BOUNDARIES.finditer(data)]

    def span(at: int) -> Span | None:
        index = bisect.bisect_right(ends, at)
        return None if index == len(ends) else (ends[index - 1] if index else 0, ends[index])

    return span


def _lf_event_span(data: bytes, at: int) -> Span | None:
    """``_event_spans`` for ``data`` without ``\\r``, where ``data[at]`` is no newline.
    Splitting from the start cuts a run of newlines into pairs from its first one,
    so the event holding ``at`` starts after the last whole pair of the last run
    (of two or more) before it: one ``rfind`` and a look back over that run."""
    end = data.find(b"\n\n", at)
    if end < 0:
        return None
    pair = data.rfind(b"\n\n", 0, at)
    if pair < 0:
        return 0, end + 2
    run = pair
    while run and data[run - 1] == 0x0A:
        run -= 1
    return run + (pair + 2 - run) // 2 * 2, end + 2


def _data_payload(event: bytes) -> bytes | None:
    """The joined ``data:`` lines of one event (SSE spec), or None if it has none."""
    parts = [
        line[5:].lstrip(b" ") if line.startswith(b"data:") else None for line in event.splitlines()
    ]
    data = [p for p in parts if p is not None]
    return b"\n".join(data) if data else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
