"""Tiny ServeGen and Azure trace files with a daily swing the tests know."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path


def servegen_rate(window: int, client: int, day: int) -> float:
    """Requests/s of one client in a window: a daily sine, client 1 at half client 0."""
    return (1.0 + 0.5 * math.sin(2 * math.pi * window / day)) / (1 + client)


def write_servegen(folder: Path, *, windows: int, day: int = 144) -> Path:
    """Two clients' chunk-<id>-trace.csv files (600 s windows), as ServeGen ships them."""
    folder.mkdir(parents=True, exist_ok=True)
    for client in (0, 1):
        lines = [
            f"{600 * w},{servegen_rate(w, client, day)},1.0,Gamma,1.0,1.0" for w in range(windows)
        ]
        (folder / f"chunk-{client}-trace.csv").write_text("\n".join(lines) + "\n")
    return folder


def write_azure(path: Path, *, minutes: int) -> Path:
    """One request every 10 s (prompt 100, output 20) for ``minutes``, Azure 2023's format."""
    start = datetime(2023, 11, 16, 18, 0, 0)
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for k in range(minutes * 6):
        stamp = start + timedelta(seconds=10 * k, microseconds=123456)
        rows.append(f"{stamp:%Y-%m-%d %H:%M:%S.%f}0,100,20")
    path.write_text("\n".join(rows))
    return path
