"""Render an engine's state in Prometheus text format under vLLM's metric names.

Names, types and labels follow vLLM V1 (``vllm/v1/metrics/loggers.py``): every
series carries ``model_name`` (and ``engine``), counters are exposed with the
``_total`` suffix, the KV gauge is a fraction in [0, 1] under both the current
``vllm:kv_cache_usage_perc`` and the older ``vllm:gpu_cache_usage_perc``, and
``vllm:request_success_total`` is split by ``finished_reason``.  Balancers and
probes parse these names, so they must not drift.
"""

from __future__ import annotations

import time

from sim.engine.engine import Engine
from sim.engine.request import FinishReason
from sim.engine.stats import Histogram


def _labels(model: str, **extra: str) -> str:
    pairs = {"engine": "0", "model_name": model, **extra}
    return "{" + ",".join(f'{key}="{value}"' for key, value in pairs.items()) + "}"


def _metric(lines: list[str], name: str, kind: str, help_: str, samples: list[str]) -> None:
    lines.append(f"# HELP {name} {help_}")
    lines.append(f"# TYPE {name} {kind}")
    lines.extend(samples)


def _histogram(lines: list[str], name: str, help_: str, hist: Histogram, model: str) -> None:
    samples = [f"{name}_bucket{_labels(model, le=le)} {count}" for le, count in hist.cumulative()]
    samples.append(f"{name}_sum{_labels(model)} {hist.sum!r}")
    samples.append(f"{name}_count{_labels(model)} {hist.count}")
    _metric(lines, name, "histogram", help_, samples)


class LoraInfoGauge:
    """vLLM's ``lora_requests_info``: adapters in use as labels, the time as the value.

    vLLM sets the gauge with ``labels(...).set_to_current_time()``, and
    ``prometheus_client`` keeps every label set it was ever given: the page lists
    one series per past combination of running and waiting adapters, and the
    current one is the series with the latest time.  Gateways with LoRA affinity
    (the Gateway API inference extension, Higress, Meridian) read that one.  The
    emulator records the combination at each scrape (vLLM at each logged step)
    and keeps the newest ``MAX_SERIES`` label sets, so the page stays bounded.
    """

    MAX_SERIES = 64

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], float] = {}

    def record(self, running: set[str], waiting: set[str], now: float) -> None:
        key = (",".join(sorted(running)), ",".join(sorted(waiting)))
        self._series.pop(key, None)
        self._series[key] = now
        while len(self._series) > self.MAX_SERIES:
            del self._series[next(iter(self._series))]

    def lines(self, max_loras: int) -> list[str]:
        name = "vllm:lora_requests_info"
        return [
            f'{name}{{max_lora="{max_loras}",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} {at!r}'
            for (running, waiting), at in self._series.items()
        ]


def _lora_info(lines: list[str], engine: Engine, gauge: LoraInfoGauge) -> None:
    running, waiting = engine.lora_adapters()
    gauge.record(running, waiting, time.time())
    _metric(
        lines,
        "vllm:lora_requests_info",
        "gauge",
        "Running stats on lora requests.",
        gauge.lines(engine.config.max_loras),
    )


def _cache_config_info(lines: list[str], engine: Engine) -> None:
    """vLLM's ``cache_config_info``: its CacheConfig as labels of a gauge fixed at 1.

    Meridian reads the model's block size from it (``core.engine_metrics``);
    only the labels the emulation has an answer for are served."""
    cfg = engine.config
    labels = (
        f'{{block_size="{cfg.block_size}",'
        f'enable_prefix_caching="{cfg.enable_prefix_caching}",'
        f'prefix_caching_hash_algo="{cfg.hash_algo.value}",'
        f'num_gpu_blocks="{cfg.num_blocks}",engine="0"}}'
    )
    name = "vllm:cache_config_info"
    _metric(
        lines, name, "gauge", "Information of the LLMEngine CacheConfig", [f"{name}{labels} 1.0"]
    )


def render_metrics(engine: Engine, model: str, lora_info: LoraInfoGauge | None = None) -> str:
    """The replica's ``/metrics`` body; ``lora_info`` when it serves adapters (vLLM
    exports ``lora_requests_info`` only with ``--enable-lora``)."""
    stats = engine.stats
    lab = _labels(model)
    lines: list[str] = []
    gauges = (
        ("vllm:num_requests_running", "Number of requests in model execution batches.",
         engine.num_running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
         engine.num_waiting),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
         engine.kv_usage),
        ("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated name).", engine.kv_usage),
    )  # fmt: skip
    for name, help_, value in gauges:
        _metric(lines, name, "gauge", help_, [f"{name}{lab} {float(value)!r}"])
    counters = (
        ("vllm:prefix_cache_queries", "Prefix cache queries, in tokens.",
         stats.prefix_cache_queries),
        ("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", stats.prefix_cache_hits),
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("vllm:generation_tokens", "Number of generation tokens processed.",
         stats.generation_tokens),
        ("vllm:num_preemptions", "Cumulative number of preemptions.", stats.preemptions),
    )  # fmt: skip
    for name, help_, value in counters:
        _metric(lines, name, "counter", help_, [f"{name}_total{lab} {float(value)!r}"])
    success = [
        f"vllm:request_success_total{_labels(model, finished_reason=r.value)} "
        f"{float(stats.finished[r.value])!r}"
        for r in FinishReason
    ]
    _metric(lines, "vllm:request_success", "counter", "Count of finished requests.", success)
    if lora_info is not None:
        _lora_info(lines, engine, lora_info)
    _cache_config_info(lines, engine)
    _histogram(
        lines, "vllm:time_to_first_token_seconds", "Time to first token in seconds.",
        stats.ttft, model,
    )  # fmt: skip
    _histogram(
        lines, "vllm:e2e_request_latency_seconds", "End to end request latency in seconds.",
        stats.e2e, model,
    )  # fmt: skip
    return "\n".join(lines) + "\n"
