"""Parsing vLLM's and SGLang's /metrics into the load numbers routing uses."""

from __future__ import annotations

import pytest

from core.engine_metrics import MetricsFormatError, parse_engine_load, parse_samples
from core.prom_text import parse

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 250.0
vllm:request_success_total{finished_reason="abort",model_name="m"} 7.0
"""


def test_vllm_sums_requests_over_engines_and_takes_the_fullest_cache() -> None:
    load = parse_engine_load(VLLM)
    assert (load.running, load.waiting) == (5, 4)
    assert load.kv_usage == pytest.approx(0.5)
    assert load.prefix_hit_rate == pytest.approx(0.25)


def test_older_vllm_gpu_cache_name_is_accepted() -> None:
    text = (
        "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
        "vllm:gpu_cache_usage_perc 0.75\n"
        "vllm:gpu_prefix_cache_queries_total 10\nvllm:gpu_prefix_cache_hits_total 5\n"
    )
    load = parse_engine_load(text)
    assert load.kv_usage == pytest.approx(0.75)
    assert load.prefix_hit_rate == pytest.approx(0.5)


def test_sglang_names() -> None:
    text = (
        'sglang:num_running_reqs{model_name="m"} 6\n'
        "sglang:num_queue_reqs 2\nsglang:token_usage 0.4\n"
    )
    load = parse_engine_load(text)
    assert (load.running, load.waiting, load.kv_usage) == (6, 2, pytest.approx(0.4))
    assert load.prefix_hit_rate is None


def test_percentages_above_one_are_read_as_percent() -> None:
    load = parse_engine_load("vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 42\n")
    assert load.kv_usage == pytest.approx(0.42)


def test_labels_with_escaped_quotes_braces_and_timestamps_parse() -> None:
    text = 'x{path="/a\\"}b",le="+Inf"} 3 1700000000000\ny NaN\nz +Inf\n'
    samples = parse_samples(text)
    assert samples["x"] == [3.0]
    assert samples["z"] == [float("inf")]
    assert len(samples["y"]) == 1


def test_a_page_without_load_gauges_is_refused() -> None:
    with pytest.raises(MetricsFormatError):
        parse_engine_load("# just comments\nprocess_cpu_seconds_total 12\n")


# vllm:cache_config_info as vLLM 0.32 serves it: an info gauge whose labels are its
# CacheConfig as strings (an excerpt of its labels, in their declaration order).
CACHE_CONFIG = (
    'vllm:cache_config_info{block_size="32",user_specified_block_size="True",'
    'kv_cache_layout="None",gpu_memory_utilization="0.9",cache_dtype="auto",'
    'sliding_window="None",enable_prefix_caching="True",'
    'prefix_caching_hash_algo="sha256_cbor",kv_cache_dtype_skip_layers="[]",'
    'num_gpu_blocks="1170",hash_block_size="32",engine="0"} 1.0\n'
)


def test_the_block_size_and_hash_algorithm_come_from_cache_config_info() -> None:
    load = parse_engine_load(VLLM + "# TYPE vllm:cache_config_info gauge\n" + CACHE_CONFIG)
    assert (load.block_size, load.hash_algo) == (32, "sha256_cbor")
    assert (load.running, load.waiting) == (5, 4)
    without = parse_engine_load(VLLM)
    assert (without.block_size, without.hash_algo) == (None, None)
    broken = CACHE_CONFIG.replace('block_size="32"', 'block_size="None"')
    assert parse_engine_load(VLLM + broken).block_size is None


def test_a_name_filter_keeps_exactly_the_samples_of_those_names() -> None:
    text = VLLM + (
        'vllm:e2e_request_latency_seconds_bucket{le="0.5",model_name="m"} 3\n'
        "vllm:num_requests_running_extra 9\n"
        "vllm:num_requests_waiting\t6\n"
        "# vllm:num_requests_running 100\n"
        "   vllm:num_requests_waiting 1\n"
        'vllm:num_requests_running{note="a \\"b\\" \\\\ c"} 0\n'
    )
    everything = parse(text)
    wanted = frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"})
    filtered = parse(text, wanted)
    assert filtered == [sample for sample in everything if sample.name in wanted]
    assert [s.value for s in filtered] == [3.0, 2.0, 4.0, 6.0, 1.0, 0.0]
    assert filtered[-1].label("note") == 'a "b" \\ c'
    # The load read through the filter is the one read from the whole page.
    assert parse_engine_load(text).running == 5
    assert parse_engine_load(text).waiting == 11
