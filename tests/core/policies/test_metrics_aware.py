"""Metrics-aware picking: queue filter, LoRA affinity, KV filter, each relaxed when empty."""

from __future__ import annotations

from core.engine_metrics import LoraInfo
from core.policies.metrics_aware import MetricsAwarePolicy
from tests.support.descriptors import request, target

# A replica running the "sql" adapter with no room for another.
SQL_ONLY = LoraInfo(running=frozenset({"sql"}), max_lora=1)


def test_targets_with_a_queue_or_full_kv_are_avoided() -> None:
    policy = MetricsAwarePolicy()
    queued = target("queued", waiting=9)
    full = target("full", kv_usage=0.95)
    busy_ok = target("ok", outstanding=4, kv_usage=0.3)
    assert policy.select(request(), [queued, full, busy_ok]) is busy_ok


def test_the_adapter_is_preferred_where_it_is_loaded() -> None:
    policy = MetricsAwarePolicy()
    loaded = target("loaded", outstanding=3, lora=SQL_ONLY)
    cold = target("cold")
    assert policy.select(request(lora="sql"), [cold, loaded]) is loaded
    assert policy.select(request(lora="chat"), [cold, loaded]) is cold
    assert policy.select(request(), [cold, loaded]) is cold


def test_queue_limit_beats_adapter_affinity() -> None:
    # An overloaded adapter holder loses to an idle target that would have to load it.
    policy = MetricsAwarePolicy()
    loaded = target("loaded", waiting=20, lora=SQL_ONLY)
    cold = target("cold")
    assert policy.select(request(lora="sql"), [loaded, cold]) is cold


def test_filters_relax_when_nothing_passes() -> None:
    policy = MetricsAwarePolicy()
    a = target("a", waiting=8, kv_usage=0.9, outstanding=2)
    b = target("b", waiting=7, kv_usage=0.99, outstanding=1)
    assert policy.select(request(lora="x"), [a, b]) is b
    assert policy.select(request(), []) is None
