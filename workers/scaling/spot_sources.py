"""Every kind of spot data by path: SkyPilot traces and 2020 availability event logs.

``load_spot_traces(path)``:

* a ``*.json`` file, or a folder of them: SkyPilot spot traces
  (``workers.scaling.traces.load_traces``: one trace per instance type in a folder);
* a ``*.out`` file, or a folder of them: availability event logs
  (``workers.scaling.availability_logs``).  A folder's logs are **merged into one
  multi-zone timeline**, from which one trace per instance type is built, its zones
  those of every file; the returned note says so.

Any other file, or a folder with neither, is refused with the formats expected.
"""

from __future__ import annotations

from pathlib import Path

from workers.scaling.availability_logs import EXPECTED_FORMAT, parse_log, traces_from_logs
from workers.scaling.traces import SpotTrace, load_traces

SKYPILOT_FORMAT = (
    'a SkyPilot spot trace (<zone>_<instance>.json: {"metadata": {"gap_seconds": G},'
    ' "data": [capacity, ...]})'
)


def load_spot_traces(path: str | Path, gap_s: float = 60.0) -> tuple[list[SpotTrace], str | None]:
    """The traces at ``path`` and, for event logs, a note of what was merged."""
    root = Path(path)
    if root.is_file():
        if root.suffix == ".json":
            return load_traces(root), None
        if root.suffix == ".out":
            return _from_logs(root.stem, [root], gap_s)
        raise ValueError(
            f"{root}: unknown spot data; expected {SKYPILOT_FORMAT} or {EXPECTED_FORMAT}"
        )
    if not root.is_dir():
        raise ValueError(f"{root}: no such file or folder")
    logs = sorted(root.glob("*.out"))
    traces = load_traces(root) if any(root.glob("*.json")) else []
    note = None
    if logs:
        more, note = _from_logs(root.name, logs, gap_s)
        traces += more
    if not traces:
        raise ValueError(
            f"{root}: no spot data; expected *.json files, {SKYPILOT_FORMAT}, or *.out files,"
            f" {EXPECTED_FORMAT}"
        )
    return traces, note


def _from_logs(name: str, files: list[Path], gap_s: float) -> tuple[list[SpotTrace], str]:
    logs = [parse_log(_text(f), str(f)) for f in files]
    traces, summary = traces_from_logs(name, logs, gap_s)
    note = (
        f"{name}: merged {summary.files} availability log(s) ({summary.events} events,"
        f" {summary.preemptions} preemptions, {summary.creation_failures} failed creations)"
        f" into one multi-zone timeline; one trace per instance type"
        f" ({', '.join(summary.instance_types)}) over zones {', '.join(summary.zones)}"
    )
    return traces, note


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not text; expected {EXPECTED_FORMAT}") from None
