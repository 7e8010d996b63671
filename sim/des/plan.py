"""From ``manage.py simulate`` options to the list of runs, and running them.

``--policies`` times ``--pushing`` (each a comma list) gives one run per pair with
everything else shared, so a table compares like with like.  An
``--experiment`` is a ready-made plan (``sim.des.experiments``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.registry import UnknownPolicyError, policy_names
from sim.des.config import (
    DEFAULT_TTFT_SLO_S,
    POLICY_ALIASES,
    SimConfig,
    SimConfigError,
    TimingConfig,
    canonical_policy,
    parse_counts,
    parse_rtts,
)
from sim.des.metrics import Summary, summarize
from sim.des.world import SimRun, SliceHook, simulate
from sim.engine import EngineConfig
from sim.engine.schedule_policy import SchedulePolicy

PUSHING_CHOICES = ("auto", "sp-p", "sp-o", "blind", "tokens")
DEFAULT_PROFILE = "l4-llama3.1-8b"


@dataclass(frozen=True)
class RunPlan:
    title: str
    runs: list[tuple[str, SimConfig]]


def per_region(text: str | None, regions: list[str], what: str) -> dict[str, int]:
    """``N`` (every region) or ``REGION=N,...``; empty when not given."""
    if not text:
        return {}
    if text.strip().isdigit():
        return dict.fromkeys(regions, int(text))
    return parse_counts(text, what)


def per_region_rate(text: str | None, regions: list[str]) -> dict[str, float]:
    if not text:
        return {}
    items = [part.strip() for part in text.split(",") if part.strip()]
    try:
        if len(items) == 1 and "=" not in items[0]:
            return dict.fromkeys(regions, float(items[0]))
        return {k.strip(): float(v) for k, _, v in (item.partition("=") for item in items)}
    except ValueError:
        raise SimConfigError(f"--rate: expected R or REGION=R[,...], got {text!r}") from None


def policies(text: str) -> list[str]:
    names = [canonical_policy(p) for p in text.split(",") if p.strip()]
    known = set(policy_names())
    for name in names:
        if name not in known:
            aliases = ", ".join(f"{a}={n}" for a, n in POLICY_ALIASES.items())
            raise UnknownPolicyError(
                f"unknown policy {name!r}; choose from {', '.join(sorted(known))} ({aliases})"
            )
    return names


def base_config(options: Mapping[str, Any]) -> SimConfig:
    """The shared ``SimConfig`` of a plan (policy and pushing are set per run)."""
    replicas = parse_counts(options["replicas"], "replicas")
    regions = list(replicas)
    # The engine's own seed stays sim.serve's default (0), as in the experiment presets
    # and the live fleet: --seed varies the workload, not the modeled output lengths.
    engine = engine_config(options)
    timing = dataclasses.replace(TimingConfig(), max_outstanding=options["max_outstanding"])
    extra: dict[str, Any] = {}
    if options.get("rtt"):
        extra["rtt_ms"] = parse_rtts(options["rtt"])
    return SimConfig(
        workload=options["workload"],
        policy_params=dict(options.get("param") or {}),
        policy="least_load",
        replicas=replicas,
        clients=per_region(options.get("clients"), regions, "clients"),
        rate=per_region_rate(options.get("rate"), regions),
        deployment=options["deployment"],
        single_region=options.get("single_region") or "",
        seed=options["seed"],
        duration_s=options.get("duration"),
        max_requests=options.get("requests"),
        time_scale=options["time_scale"],
        speed=options["speed"],
        ramp_s=options.get("ramp") or 0.0,
        engine=engine,
        timing=timing,
        length_predictor=options.get("length_predictor") or "none",
        ttft_slo_s=options.get("ttft_slo") or DEFAULT_TTFT_SLO_S,
        **extra,
    )


def engine_config(options: Mapping[str, Any]) -> EngineConfig:
    """The replicas' engine: ``--profile``'s shape, with ``--kv-tokens``/``--kv-blocks``
    and ``--max-model-len`` overriding it, scheduling as ``--schedule-policy`` says."""
    try:
        return EngineConfig.for_profile(
            options.get("profile") or DEFAULT_PROFILE,
            kv_tokens=options.get("kv_tokens"),
            kv_blocks=options.get("kv_blocks"),
            max_model_len=options.get("max_model_len"),
            schedule_policy=SchedulePolicy(options.get("schedule_policy") or SchedulePolicy.FCFS),
        )
    except ValueError as exc:
        raise SimConfigError(str(exc)) from None


def engine_overridden(options: Mapping[str, Any]) -> bool:
    """Whether the options name an engine other than the default one."""
    keys = ("kv_tokens", "kv_blocks", "max_model_len")
    named = options.get("profile") not in (None, DEFAULT_PROFILE)
    reordered = options.get("schedule_policy") not in (None, SchedulePolicy.FCFS)
    return named or reordered or any(options.get(key) is not None for key in keys)


def with_engine(plan: RunPlan, engine: EngineConfig) -> RunPlan:
    """``plan`` with every run on ``engine`` (an experiment in another engine regime)."""
    runs = [(label, dataclasses.replace(config, engine=engine)) for label, config in plan.runs]
    return RunPlan(f"{plan.title} [{describe_engine(engine)}]", runs)


def describe_engine(engine: EngineConfig) -> str:
    kv = engine.num_blocks * engine.block_size
    shape = f"{engine.profile}, KV {kv:,} tokens, context {engine.max_model_len:,}"
    if engine.schedule_policy is SchedulePolicy.LPM:
        return f"{shape}, longest prefix first"
    return shape


def build_plan(options: Mapping[str, Any]) -> RunPlan:
    base = base_config(options)
    names = policies(options["policies"])
    pushings = [p.strip() for p in options["pushing"].split(",") if p.strip()]
    bad = [p for p in pushings if p not in PUSHING_CHOICES]
    if bad or not pushings:
        raise SimConfigError(f"--pushing: choose from {', '.join(PUSHING_CHOICES)}")
    runs = []
    for name in names:
        for pushing in pushings:
            config = dataclasses.replace(base, policy=name, pushing=pushing)
            label = name if len(pushings) == 1 else f"{name} {config.effective_pushing}"
            runs.append((label, config))
    replicas = ",".join(f"{r}={n}" for r, n in base.replicas.items())
    title = f"{base.workload} on {replicas}"
    if engine_overridden(options):
        title += f" [{describe_engine(base.engine)}]"
    return RunPlan(title, runs)


def execute(
    plan: RunPlan,
    progress: Callable[[str, SimRun, Summary], None] | None = None,
    *,
    trace_memory: bool = False,
    ttft_slo_s: float = DEFAULT_TTFT_SLO_S,
    watch: Callable[[str, SimConfig], SliceHook] | None = None,
) -> list[Summary]:
    """Run every run of ``plan`` in order; ``progress`` hears about each as it ends,
    and ``watch(label, config)`` gives each run a hook for its progress while it runs."""
    summaries = []
    for label, config in plan.runs:
        on_slice = watch(label, config) if watch is not None else None
        run = simulate(config, trace_memory=trace_memory, on_slice=on_slice)
        summary = summarize(run, label, ttft_slo_s)
        summaries.append(summary)
        if progress is not None:
            progress(label, run, summary)
    return summaries
