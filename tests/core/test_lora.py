"""LoRA: lora_requests_info parsed as vLLM exports it, adapters resolved, affinity tiers."""

from __future__ import annotations

import pytest

from core.engine_metrics import LoraInfo, parse_engine_load
from core.lora import (
    AdapterDirectory,
    UnknownModelError,
    adapters_in_models,
    lora_affinity,
    resolve_model,
)
from tests.support.descriptors import target

# prometheus_client keeps every label set the gauge was given; the latest time is current.
INFO = "vllm:lora_requests_info"
METRICS = f"""\
vllm:num_requests_running{{model_name="base"}} 2.0
vllm:num_requests_waiting{{model_name="base"}} 1.0
# HELP {INFO} Running stats on lora requests.
# TYPE {INFO} gauge
{INFO}{{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}} 1.7e9
{INFO}{{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="fr"}} 1.70000002e9
{INFO}{{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""}} 1.70000001e9
"""


def test_the_latest_lora_series_is_the_current_one() -> None:
    info = parse_engine_load(METRICS).lora
    assert info == LoraInfo(frozenset({"sql", "chat"}), frozenset({"fr"}), max_lora=2)
    assert info.active == {"sql", "chat", "fr"} and not info.has_room


def test_an_engine_without_the_metric_reports_no_lora_info() -> None:
    assert parse_engine_load("vllm:num_requests_running 0\n").lora is None


def test_an_adapter_resolves_to_its_base_model() -> None:
    adapters = {"sql": "base", "orphan": "gone"}
    assert resolve_model("base", {"base"}, adapters) == ("base", None)
    assert resolve_model("sql", {"base"}, adapters) == ("base", "sql")
    for unknown in ("orphan", "nope"):
        with pytest.raises(UnknownModelError):
            resolve_model(unknown, {"base"}, adapters)


def test_affinity_prefers_active_then_room_then_anything() -> None:
    active = target("active", lora=LoraInfo(running=frozenset({"sql"}), max_lora=1))
    roomy = target("roomy", lora=LoraInfo(running=frozenset({"chat"}), max_lora=2))
    full = target("full", lora=LoraInfo(waiting=frozenset({"fr"}), max_lora=1))
    silent = target("silent")  # never probed, or an engine without the metric
    everyone = [full, roomy, active, silent]
    assert lora_affinity(everyone, "sql") == [active]
    assert lora_affinity(everyone, "de") == [roomy, silent]
    assert lora_affinity([full], "de") == [full]
    assert lora_affinity(everyone, None) == everyone


def test_adapters_are_read_from_a_vllm_models_list() -> None:
    payload = {
        "object": "list",
        "data": [
            {"id": "llama", "object": "model", "root": "/models/llama", "parent": None},
            {"id": "sql", "object": "model", "root": "/adapters/sql", "parent": "llama"},
            {"id": "odd", "parent": 7},
            "not a card",
        ],
    }
    assert adapters_in_models(payload) == {"sql": "llama"}
    assert adapters_in_models({"error": "nope"}) == {} == adapters_in_models([])


def test_learned_adapters_merge_across_replicas_and_configuration_wins() -> None:
    directory = AdapterDirectory({"sql": "configured-base"})
    directory.record("r1", {"sql": "llama", "chat": "llama"})
    directory.record("r2", {"summarise": "mistral"})
    assert directory.adapters() == {
        "sql": "configured-base", "chat": "llama", "summarise": "mistral",
    }  # fmt: skip
    directory.record("r1", {})  # r1 unloaded its adapters
    directory.keep_only(["r1"])  # r2 left the fleet
    assert directory.adapters() == {"sql": "configured-base"}
