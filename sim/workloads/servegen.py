"""ServeGen (Alibaba Bailian) per-client rate traces: arrivals from window statistics.

ServeGen publishes no request log: each client ("chunk") has a CSV with one row
per 600-second window, ``window_start_s, rate, cv, iat_dist, param1, param2``
(no header); ``rate`` is requests per second, ``iat_dist`` the fitted
inter-arrival distribution (``Gamma`` or ``Weibull``, shape and scale) and an
empty name means no requests in that window.  Optional
``chunk-<id>-dataset.json`` files map a window start (every 6 h) to
string-encoded ``{tokens: probability}`` PDFs of ``input_tokens`` and
``output_tokens`` (multimodal clients: ``text_tokens``, ``image_tokens``,
``audio_tokens``, ``video_tokens``, whose draws add up to the prompt); a window
with no requests carries an empty ``{}`` PDF, which is read as "no lengths
here", never as an error.

Arrivals are regenerated the way ServeGen's own generator does it: inter-arrival
gaps are drawn from the window's fitted distribution and rescaled so their mean
is ``1/rate`` (the fit keeps the burstiness, the rate keeps the load), per
client, then merged across clients in time order.  Lengths come from the
client's PDFs when its dataset file is there, else from a log-normal default
(``input_median``/``output_median``).  The trace has no text or prefix data,
so every prompt is unique (a per-request tag first), like the Azure reader.

``start_s`` picks the trace second to begin at (the trace wraps around), which
is how the simulator time-shifts one trace per region for diurnal load
(``shifted``); ``rate_scale`` thins the load to fit a small fleet.
"""

from __future__ import annotations

import ast
import csv
import dataclasses
import heapq
import json
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sim.workloads.program import ApiKind, Program, Step, TraceFormatError
from sim.workloads.text import seeded, tagged_text

WINDOW_S = 600.0
_CHUNK_RE = re.compile(r"chunk-(\d+)-trace\.csv$")
# A multimodal request's prompt is its text plus its media tokens (ServeGen's
# mm-* datasets give one PDF per modality instead of ``input_tokens``).
INPUT_FIELDS = ("input_tokens",)
MULTIMODAL_INPUT_FIELDS = ("text_tokens", "image_tokens", "audio_tokens", "video_tokens")
LengthPdfs = tuple[tuple[dict[int, float], ...], dict[int, float]]


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    rate: float
    dist: str
    shape: float
    scale: float

    def gap(self, rng: random.Random) -> float:
        """One inter-arrival gap with the fitted shape, rescaled to mean ``1/rate``."""
        if self.dist == "gamma" and self.shape > 0 and self.scale > 0:
            return rng.gammavariate(self.shape, 1.0) / self.shape / self.rate
        if self.dist == "weibull" and self.shape > 0 and self.scale > 0:
            mean = math.gamma(1.0 + 1.0 / self.shape)
            return rng.weibullvariate(1.0, self.shape) / mean / self.rate
        return rng.expovariate(self.rate)


@dataclass(frozen=True)
class ServeGenClient:
    chunk: int
    windows: tuple[Window, ...]
    lengths: dict[float, LengthPdfs]


def read_client(path: Path) -> ServeGenClient:
    """One ``chunk-<id>-trace.csv`` and, if present, its ``-dataset.json``."""
    match = _CHUNK_RE.search(path.name)
    if match is None:
        raise TraceFormatError(path, 0, "expected a file named chunk-<id>-trace.csv")
    windows = []
    with path.open(encoding="utf-8", newline="") as handle:
        for line, row in enumerate(csv.reader(handle), start=1):
            if row and "".join(row).strip():
                windows.append(_window(path, line, row))
    dataset = path.with_name(path.name.replace("-trace.csv", "-dataset.json"))
    lengths = _lengths(dataset) if dataset.is_file() else {}
    return ServeGenClient(int(match.group(1)), tuple(windows), lengths)


def _window(path: Path, line: int, row: list[str]) -> Window:
    if len(row) != 6:
        raise TraceFormatError(path, line, f"expected 6 columns, got {len(row)}: {row!r}")
    try:
        start, rate = float(row[0]), float(row[1])
        shape = float(row[4]) if row[4].strip() else 0.0
        scale = float(row[5]) if row[5].strip() else 0.0
    except ValueError as exc:
        raise TraceFormatError(path, line, f"cannot read {row!r}: {exc}") from exc
    dist = row[3].strip().lower()
    if rate < 0 or not math.isfinite(rate) or dist not in ("", "gamma", "weibull"):
        raise TraceFormatError(path, line, f"bad rate or distribution in {row!r}")
    return Window(start, rate if dist else 0.0, dist, shape, scale)


def _lengths(path: Path) -> dict[float, LengthPdfs]:
    """Each window's (input PDFs, output PDF); a quiet window (empty ``{}`` PDFs) has none.

    ServeGen writes ``{}`` for a 6 h window in which the client sent nothing: that
    is valid data, not an error, and a request later in the trace takes the last
    window that has lengths (or the default distribution when none has)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        lengths = {}
        for start, fields in raw.items():
            names = INPUT_FIELDS if "input_tokens" in fields else MULTIMODAL_INPUT_FIELDS
            inputs = tuple(_pdf(fields[name]) for name in names if name in fields)
            output = _pdf(fields["output_tokens"])
            if not inputs:
                raise KeyError("input_tokens")
            if all(inputs) and output:
                lengths[float(start)] = (inputs, output)
        return lengths
    except (ValueError, KeyError, TypeError, SyntaxError, AttributeError) as exc:
        raise TraceFormatError(path, 0, f"not a ServeGen dataset file: {exc}") from exc


def _pdf(text: str) -> dict[int, float]:
    """A ``{tokens: probability}`` PDF; empty for a quiet window."""
    # The PDFs are Python dict literals in strings; literal_eval evaluates no code.
    value = ast.literal_eval(text)
    if not isinstance(value, dict):
        raise ValueError("a length PDF must be a {tokens: probability} dict")
    pdf = {int(k): float(v) for k, v in value.items()}
    if pdf and sum(pdf.values()) <= 0:
        raise ValueError("a length PDF needs a positive total probability")
    return pdf


@dataclass(frozen=True)
class ServeGenConfig:
    seed: int = 0
    start_s: float = 0.0
    rate_scale: float = 1.0
    input_median: int = 600
    output_median: int = 200
    sigma: float = 0.8
    max_input_tokens: int = 4096
    max_output_tokens: int = 1024


class ServeGenTrace:
    """Single-request programs with arrival offsets from a directory (or one CSV)."""

    name = "servegen"
    timed = True

    def __init__(self, path: Path | str, config: ServeGenConfig | None = None) -> None:
        self.path = Path(path)
        self.config = config or ServeGenConfig()
        if self.config.rate_scale <= 0:
            raise ValueError("rate_scale must be positive")

    def shifted(self, offset_s: float) -> ServeGenTrace:
        """The same trace starting ``offset_s`` later in its day (another region's clock)."""
        config = dataclasses.replace(self.config, start_s=self.config.start_s + offset_s)
        shifted = ServeGenTrace(self.path, config)
        shifted.__dict__["clients"] = self.clients  # share the parsed files
        return shifted

    @cached_property
    def clients(self) -> tuple[ServeGenClient, ...]:
        if self.path.is_file():
            return (read_client(self.path),)
        if not self.path.is_dir():
            raise TraceFormatError(self.path, 0, "no such file or directory")
        files = sorted(
            (p for p in self.path.iterdir() if _CHUNK_RE.search(p.name)),
            key=lambda p: int(_CHUNK_RE.search(p.name).group(1)),  # type: ignore[union-attr]
        )
        if not files:
            raise TraceFormatError(self.path, 0, "no chunk-<id>-trace.csv files here")
        return tuple(read_client(p) for p in files)

    @cached_property
    def _by_chunk(self) -> dict[int, ServeGenClient]:
        return {client.chunk: client for client in self.clients}

    @cached_property
    def horizon_s(self) -> float:
        last = max((w.start for c in self.clients for w in c.windows), default=0.0)
        return last + WINDOW_S

    def programs(self) -> Iterator[Program]:
        streams = [self._arrivals(client) for client in self.clients]
        merged = heapq.merge(*streams)
        for index, (at, chunk, k) in enumerate(merged):
            yield self._program(index, at, chunk, k)

    def _arrivals(self, client: ServeGenClient) -> Iterator[tuple[float, int, int]]:
        """``(offset, chunk, k)`` for the client's requests, from ``start_s`` on, one lap."""
        horizon = self.horizon_s
        start = self.config.start_s % horizon
        rng = seeded("servegen", self.config.seed, client.chunk)
        k = 0
        for lap in (0, 1):
            for window in client.windows:
                begin = window.start - start + lap * horizon
                if begin + WINDOW_S <= 0 or begin >= horizon or window.rate <= 0:
                    continue
                scaled = dataclasses.replace(window, rate=window.rate * self.config.rate_scale)
                at = begin + scaled.gap(rng)
                while at < begin + WINDOW_S:
                    if 0 <= at < horizon:
                        yield at, client.chunk, k
                        k += 1
                    at += scaled.gap(rng)

    def _program(self, index: int, at: float, chunk: int, k: int) -> Program:
        c = self.config
        # The start is part of the tag: regions replaying shifted copies of one trace
        # must not send each other's prompts.
        start = int(c.start_s)
        rng = seeded("servegen-request", c.seed, start, chunk, k)
        prompt_len, output_len = self._lengths(rng, chunk, at)
        prompt = tagged_text(f"sg{chunk}s{start}x{k}", rng, prompt_len)
        step = Step(kind=ApiKind.COMPLETION, prompt=prompt, max_tokens=output_len, ignore_eos=True)
        return Program(program_id=index, session_key=f"client-{chunk}", steps=(step,), start=at)

    def _lengths(self, rng: random.Random, chunk: int, at: float) -> tuple[int, int]:
        c = self.config
        client = self._by_chunk[chunk]
        trace_t = (at + c.start_s) % self.horizon_s
        starts = [s for s in sorted(client.lengths) if s <= trace_t]
        if starts:
            inputs, outputs = client.lengths[starts[-1]]
            prompt = sum(_draw(rng, pdf) for pdf in inputs)
            output = _draw(rng, outputs)
        else:
            prompt = round(rng.lognormvariate(math.log(c.input_median), c.sigma))
            output = round(rng.lognormvariate(math.log(c.output_median), c.sigma))
        return min(max(prompt, 1), c.max_input_tokens), min(max(output, 1), c.max_output_tokens)


def _draw(rng: random.Random, pdf: dict[int, float]) -> int:
    return rng.choices(list(pdf), weights=list(pdf.values()), k=1)[0]
