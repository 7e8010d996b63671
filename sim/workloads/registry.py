"""The ``--workload`` value: a name, optionally with options or a trace file.

* ``conversations``, ``system-prompts``, ``tot``: built-in synthetic workloads;
  options follow a colon as ``key=value`` pairs naming fields of the workload's
  config, e.g. ``tot:branching=4,depth=4`` or ``conversations:users=64,turns_max=8``.
* ``mooncake:PATH``, ``azure:PATH``, ``sharegpt:PATH``: trace readers for a file.
* ``servegen:PATH[@key=value,...]``: ServeGen per-client rate traces, a directory
  of ``chunk-<id>-trace.csv`` files (or one of them); options after ``@`` name
  fields of ``ServeGenConfig``, e.g. ``servegen:DIR@rate_scale=0.05,start_s=28800``.

The seed comes from the caller (``--seed``), so one flag makes a whole run
reproducible.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sim.workloads.azure import AzureTrace
from sim.workloads.mooncake import MooncakeTrace
from sim.workloads.program import Workload
from sim.workloads.servegen import ServeGenConfig, ServeGenTrace
from sim.workloads.sharegpt import ShareGptConversations
from sim.workloads.synthetic import (
    Conversations,
    ConversationsConfig,
    SystemPrompts,
    SystemPromptsConfig,
    TreeOfThought,
    TreeOfThoughtConfig,
)

# name -> (config class, workload class taking that config)
SYNTHETIC: dict[str, tuple[type[Any], Callable[[Any], Workload]]] = {
    "conversations": (ConversationsConfig, Conversations),
    "system-prompts": (SystemPromptsConfig, SystemPrompts),
    "tot": (TreeOfThoughtConfig, TreeOfThought),
}

TRACES: dict[str, Callable[[Path, int], Workload]] = {
    "mooncake": lambda path, seed: MooncakeTrace(path),
    "azure": lambda path, seed: AzureTrace(path, seed=seed),
    "sharegpt": lambda path, seed: ShareGptConversations(path),
}

WORKLOAD_NAMES = (*SYNTHETIC, *(f"{name}:PATH" for name in TRACES), "servegen:PATH")


def reads_trace_file(spec: str) -> bool:
    """Whether ``spec`` replays a recorded file of requests (``mooncake:``, ``azure:``,
    ``sharegpt:``): a finite set of programs, each one person's, not a seeded stream."""
    return spec.strip().partition(":")[0] in TRACES


class WorkloadSpecError(ValueError):
    """A ``--workload`` value that names no workload or has bad options."""


def parse_workload(spec: str, *, seed: int = 0) -> Workload:
    """The workload ``spec`` names, seeded with ``seed``."""
    name, _, rest = spec.strip().partition(":")
    if name in SYNTHETIC:
        config_class, workload_class = SYNTHETIC[name]
        return workload_class(_config(config_class, name, rest, seed))
    if name == "servegen":
        return _servegen(rest, seed)
    if name in TRACES:
        if not rest:
            raise WorkloadSpecError(f"{name} reads a trace file: use {name}:PATH")
        path = Path(rest).expanduser()
        if not path.is_file():
            raise WorkloadSpecError(f"{name} trace file not found: {path}")
        return TRACES[name](path, seed)
    raise WorkloadSpecError(
        f"unknown workload {spec!r}; choose one of: {', '.join(WORKLOAD_NAMES)}"
    )


def _servegen(rest: str, seed: int) -> Workload:
    """``PATH[@options]``: a directory of per-client CSVs (or one CSV) and its options."""
    path_text, _, options = rest.partition("@")
    if not path_text:
        raise WorkloadSpecError("servegen reads a directory of chunk CSVs: use servegen:PATH")
    path = Path(path_text).expanduser()
    if not path.exists():
        raise WorkloadSpecError(f"servegen trace not found: {path}")
    return ServeGenTrace(path, _config(ServeGenConfig, "servegen", options, seed))


def _config(config_class: type[Any], name: str, options: str, seed: int) -> Any:
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    values: dict[str, Any] = {"seed": seed}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields or key == "seed":
            known = ", ".join(k for k in fields if k != "seed")
            raise WorkloadSpecError(f"{name}: bad option {item!r}; options: {known} (key=value)")
        values[key] = _convert(name, key, raw.strip(), fields[key].default)
    try:
        return config_class(**values)
    except ValueError as exc:
        raise WorkloadSpecError(f"{name}: {exc}") from exc


def _convert(name: str, key: str, raw: str, default: object) -> object:
    # Field types follow their defaults (annotations are strings under __future__).
    if isinstance(default, bool):
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off"}:
            return False
    else:
        try:
            return type(default)(raw)  # type: ignore[call-arg]
        except ValueError:
            pass
    raise WorkloadSpecError(f"{name}: {key}={raw!r} is not a valid {type(default).__name__}")
