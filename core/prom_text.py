"""Prometheus text exposition, parsed once for everyone: balancers read engines'
``/metrics`` with it, the control plane reads balancers' (pure, no I/O)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

_SAMPLE_RE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>(?:[^}\"]|\"(?:[^\"\\]|\\.)*\")*)\})?"
    r"\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$"
)
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, name: str, default: str = "") -> str:
        return dict(self.labels).get(name, default)

    @property
    def key(self) -> str:
        """A stable string naming the series (kept in Redis between scrapes)."""
        inner = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.name}|{inner}"


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value  # the usual label value: nothing to undo, no regex call
    return re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], value)


def parse(text: str, names: frozenset[str] | None = None) -> list[Sample]:
    """Every sample of ``text``; lines that are not samples are skipped.

    With ``names``, only samples of those metric names: any other line is dropped on
    its name alone, before the regular expressions (an engine's histograms are most
    of its ``/metrics``, and a balancer reads a few gauges of it several times a second).
    """
    out = []
    # One C-level prefix test drops almost every other line; a name that merely
    # starts with a wanted one is dropped by the exact test after it.
    prefixes = _prefixes(names) if names is not None else ()
    for raw in text.splitlines():
        line = raw.strip()
        if names is not None:
            if not line.startswith(prefixes) or _name_of(line) not in names:
                continue
        elif not line or line.startswith("#"):
            continue
        match = _SAMPLE_RE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = tuple(
            sorted((k, _unescape(v)) for k, v in _LABEL_RE.findall(match["labels"] or ""))
        )
        out.append(Sample(match["name"], labels, value))
    return out


@functools.lru_cache(maxsize=16)
def _prefixes(names: frozenset[str]) -> tuple[str, ...]:
    """``names`` as a tuple for ``str.startswith`` (the sets asked for are few)."""
    return tuple(sorted(names))


def _name_of(line: str) -> str:
    """The metric name a sample line starts with (up to ``{`` or white space)."""
    end = len(line)
    for stop in ("{", " ", "\t"):
        at = line.find(stop, 0, end)
        if at != -1:
            end = at
    return line[:end]
