"""Read an inference engine's Prometheus ``/metrics`` into the load numbers routing uses.

Both engines Meridian talks to expose the same three facts under different names:

=====================  ==============================  ======================
fact                   vLLM                            SGLang
=====================  ==============================  ======================
requests running       ``vllm:num_requests_running``   ``sglang:num_running_reqs``
requests waiting       ``vllm:num_requests_waiting``   ``sglang:num_queue_reqs``
KV cache in use (0-1)  ``vllm:kv_cache_usage_perc``    ``sglang:token_usage``
                       (older: ``gpu_cache_usage_perc``)
=====================  ==============================  ======================

plus vLLM's prefix-cache counters (``vllm:prefix_cache_queries_total`` and
``..._hits_total``; older releases prefix them ``gpu_``), and its engine
configuration: ``vllm:cache_config_info`` is a gauge fixed at 1 whose labels are
the engine's ``CacheConfig`` as strings, among them ``block_size="32"`` and
``prefix_caching_hash_algo="sha256"`` (``vllm/v1/metrics/loggers.py``,
``log_metrics_info``).  Its block size is the model's
(``core.block_identity``).  vLLM reports one series per model/engine
label set; running and waiting are summed across them
(every one occupies the replica), cache usage takes the fullest engine (the one
that will preempt first).  Despite its name ``kv_cache_usage_perc`` is a
fraction in [0, 1] in vLLM; values above 1 are read as percentages.

With ``--enable-lora`` vLLM also exports ``vllm:lora_requests_info``: a gauge whose
*labels* carry the facts (``running_lora_adapters`` and ``waiting_lora_adapters``,
comma-separated adapter names, and ``max_lora``) and whose value is the time it
was set.  ``prometheus_client`` keeps every label set the gauge was ever given,
so the page lists one series per past combination; the current one is the
series with the latest time (``parse_lora_info``), as the Gateway API inference
extension reads it.

The parser handles the text exposition format (comments, labels with escaped
quotes, optional timestamps, ``NaN``/``+Inf``) and nothing else; it never raises
on unknown metrics, only on text that contains none of the load gauges, which
means the endpoint is not an engine (``MetricsFormatError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.prom_text import Sample, parse

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
PREFIX_QUERIES = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries",
)
PREFIX_HITS = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits",
)

CACHE_CONFIG_INFO = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
# Every name parse_engine_load reads: the probe parses only these lines of /metrics.
LOAD_NAMES = frozenset(
    (*RUNNING, *WAITING, *KV_USAGE, *PREFIX_QUERIES, *PREFIX_HITS, CACHE_CONFIG_INFO, LORA_INFO)
)


class MetricsFormatError(ValueError):
    """The text is not an engine's metrics page."""


@dataclass(frozen=True, slots=True)
class LoraInfo:
    """The LoRA adapters a replica is using now, and how many it may hold at once."""

    running: frozenset[str] = frozenset()
    waiting: frozenset[str] = frozenset()
    max_lora: int = 0

    @property
    def active(self) -> frozenset[str]:
        """Adapters in GPU memory or about to be: those of running and waiting requests."""
        return self.running | self.waiting

    @property
    def has_room(self) -> bool:
        """Whether one more adapter fits without evicting an active one."""
        return len(self.active) < self.max_lora


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int
    waiting: int
    kv_usage: float
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    block_size: int | None = None  # vllm:cache_config_info, when served
    hash_algo: str | None = None  # its prefix_caching_hash_algo
    lora: LoraInfo | None = None  # None: the engine serves no adapters

    @property
    def prefix_hit_rate(self) -> float | None:
        """Lifetime prefix-cache hit rate (tokens hit / tokens queried), if reported."""
        if not self.prefix_queries or self.prefix_hits is None:
            return None
        return self.prefix_hits / self.prefix_queries


def parse_samples(text: str) -> dict[str, list[float]]:
    """Every sample value by metric name (label sets flattened into the list)."""
    return _by_name(parse(text))


def _by_name(parsed: list[Sample]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {}
    for sample in parsed:
        samples.setdefault(sample.name, []).append(sample.value)
    return samples


def cache_config(parsed: list[Sample]) -> tuple[int | None, str | None]:
    """Block size and hash algorithm from ``vllm:cache_config_info`` (None: not said).

    Every engine of a replica shares one cache config; the first series with a
    positive integer block size speaks for the replica."""
    for sample in parsed:
        if sample.name != CACHE_CONFIG_INFO:
            continue
        size = sample.label("block_size")
        if size.isdigit() and int(size) > 0:
            return int(size), sample.label("prefix_caching_hash_algo") or None
    return None, None


def parse_engine_load(text: str) -> EngineLoad:
    parsed = parse(text, LOAD_NAMES)
    samples = _by_name(parsed)
    running = _first(samples, RUNNING)
    waiting = _first(samples, WAITING)
    if running is None and waiting is None:
        raise MetricsFormatError(
            "no vLLM or SGLang load gauge (num_requests_running/num_running_reqs) found"
        )
    usage_values = _first(samples, KV_USAGE)
    usage = max(usage_values) if usage_values else 0.0
    if usage > 1.0:
        usage /= 100.0
    queries = _first(samples, PREFIX_QUERIES)
    hits = _first(samples, PREFIX_HITS)
    block_size, hash_algo = cache_config(parsed)
    return EngineLoad(
        running=_count(running),
        waiting=_count(waiting),
        kv_usage=usage,
        prefix_queries=sum(queries) if queries else None,
        prefix_hits=sum(hits) if hits else None,
        block_size=block_size,
        hash_algo=hash_algo,
        lora=parse_lora_info(parsed),
    )


def parse_lora_info(samples: list[Sample]) -> LoraInfo | None:
    """The latest ``lora_requests_info`` series, or None when the engine has none."""
    series = [s for s in samples if s.name == LORA_INFO and not math.isnan(s.value)]
    if not series:
        return None
    latest = max(series, key=lambda s: s.value)
    try:
        max_lora = int(float(latest.label("max_lora", "0")))
    except ValueError:
        max_lora = 0
    return LoraInfo(
        running=_names(latest.label("running_lora_adapters")),
        waiting=_names(latest.label("waiting_lora_adapters")),
        max_lora=max_lora,
    )


def _names(joined: str) -> frozenset[str]:
    return frozenset(name.strip() for name in joined.split(",") if name.strip())


def _first(samples: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    for name in names:
        values = [v for v in samples.get(name, ()) if not math.isnan(v)]
        if values:
            return values
    return None


def _count(values: list[float] | None) -> int:
    return round(sum(values)) if values else 0
