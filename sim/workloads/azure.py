"""Azure LLM inference trace (2023, "Splitwise") CSV files.

Header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps are wall-clock like
``2023-11-16 18:15:46.6805900`` (seven fractional digits, no time zone, more than
``datetime`` parses), so the fraction is read separately.  Arrival offsets are
relative to the first row.  The trace has no text and no prefix information, so
every request gets a unique prompt (its first token is a per-row tag) of exactly
``ContextTokens`` tokens: no accidental prefix sharing.  Requests go to
``/v1/completions`` with ``max_tokens=GeneratedTokens`` and ``ignore_eos``.

The published file has no trailing newline; ``csv`` handles that.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from sim.workloads.files import check_readable
from sim.workloads.program import ApiKind, Program, Step, TraceFormatError
from sim.workloads.text import seeded, tagged_text

AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_timestamp(text: str) -> float:
    """Seconds since the epoch (naive, treated as UTC) with the full fraction kept."""
    whole, _, fraction = text.strip().partition(".")
    base = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    if fraction and not fraction.isdigit():
        raise ValueError(f"bad fractional seconds in {text!r}")
    seconds = (base - datetime(1970, 1, 1)).total_seconds()
    return seconds + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


class AzureTrace:
    """Programs from an Azure LLM inference CSV: one single-request program per row."""

    name = "azure"
    timed = True

    def __init__(self, path: Path | str, *, seed: int = 0) -> None:
        self.path = Path(path)
        self.seed = seed

    def programs(self) -> Iterator[Program]:
        check_readable(self.path)
        with self.path.open(encoding="utf-8", newline="") as handle:
            rows = csv.reader(handle)
            header = next(rows, None)
            if header is None or tuple(cell.strip() for cell in header) != AZURE_HEADER:
                raise TraceFormatError(
                    self.path, 1, f"expected the header {','.join(AZURE_HEADER)}, got {header!r}"
                )
            first: float | None = None
            index = 0
            for row in rows:
                line = rows.line_num
                if not row or not "".join(row).strip():
                    continue
                at, context, generated = self._parse_row(line, row)
                first = at if first is None else first
                yield self._program(index, line, at - first, context, generated)
                index += 1

    def _parse_row(self, line: int, row: list[str]) -> tuple[float, int, int]:
        if len(row) != len(AZURE_HEADER):
            raise TraceFormatError(self.path, line, f"expected 3 columns, got {len(row)}: {row!r}")
        try:
            at = parse_timestamp(row[0])
            context, generated = int(row[1]), int(row[2])
        except ValueError as exc:
            raise TraceFormatError(self.path, line, f"cannot read {row!r}: {exc}") from exc
        if context < 1 or generated < 0:
            raise TraceFormatError(self.path, line, f"token counts out of range in {row!r}")
        return at, context, generated

    def _program(
        self, index: int, line: int, offset: float, context: int, generated: int
    ) -> Program:
        prompt = tagged_text(f"azure{line}", seeded("azure", self.seed, line), context)
        step = Step(
            kind=ApiKind.COMPLETION,
            prompt=prompt,
            max_tokens=max(1, generated),
            ignore_eos=True,
        )
        # Rows are in time order in the published file; clamp in case a file is not.
        return Program(program_id=index, session_key="", steps=(step,), start=max(0.0, offset))
