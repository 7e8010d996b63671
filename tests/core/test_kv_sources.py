"""Reading vLLM's ``GET /kv_event_sources`` and what an endpoint means to the engine."""

from __future__ import annotations

import pytest

from core.kv_sources import EventSource, dial_address, is_bind_endpoint, parse_event_sources

# What vLLM 0.32 answers: its resolved KVEventsConfig per data-parallel rank.
VLLM_032 = {
    "1": {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5558",
        "replay_endpoint": None,
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": "",
    },
    "0": {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5567",
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": "kv",
    },
}


def test_vllm_032_answer_is_read_per_rank_in_rank_order() -> None:
    assert parse_event_sources(VLLM_032) == [
        EventSource(0, "tcp://*:5557", "tcp://*:5567", "kv"),
        EventSource(1, "tcp://*:5558", None, ""),
    ]


def test_events_off_is_an_empty_answer() -> None:
    assert parse_event_sources({}) == []
    off = {"0": {**VLLM_032["0"], "enable_kv_cache_events": False, "publisher": "null"}}
    assert parse_event_sources(off) == []


def test_list_shapes_of_later_versions_are_read_too() -> None:
    entry = {"data_parallel_rank": 2, "endpoint": "tcp://*:1", "replay_endpoint": None}
    expected = [EventSource(2, "tcp://*:1")]
    assert parse_event_sources([entry]) == expected
    assert parse_event_sources({"sources": [entry]}) == expected


@pytest.mark.parametrize(
    "body", ["tcp://*:1", {"0": "tcp://*:1"}, {"x": {"endpoint": "tcp://*:1"}}, {"0": {}}]
)
def test_malformed_answers_are_refused(body: object) -> None:
    with pytest.raises(ValueError):
        parse_event_sources(body)


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://10.0.0.7:5557", False),
        ("tcp://0.0.0.0:5557", False),  # vLLM connects here too: no '*' in it
    ],
)
def test_bind_or_connect_follows_vllms_rule(endpoint: str, binds: bool) -> None:
    assert is_bind_endpoint(endpoint) is binds


def test_wildcard_hosts_are_dialled_at_the_replicas_host() -> None:
    assert dial_address("tcp://*:5557", "10.0.0.7") == "tcp://10.0.0.7:5557"
    assert dial_address("tcp://0.0.0.0:5557", "host-a") == "tcp://host-a:5557"
    assert dial_address("tcp://[::]:5557", "fd00::7") == "tcp://[fd00::7]:5557"
    assert dial_address("tcp://10.0.0.9:5557", "10.0.0.7") == "tcp://10.0.0.9:5557"
    assert dial_address("ipc:///tmp/kv", "10.0.0.7") == "ipc:///tmp/kv"
