"""Where a replica publishes its KV events: vLLM's ``GET /kv_event_sources`` (pure).

vLLM 0.32 answers with its resolved ``KVEventsConfig`` per data-parallel rank,
keyed by the rank (JSON turns the int keys into strings)::

    {"0": {"enable_kv_cache_events": true, "publisher": "zmq",
           "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
           "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000,
           "topic": ""}}

and ``{}`` when events are off.  Later vLLM versions answer a list of
``{data_parallel_rank, endpoint, replay_endpoint, topic}`` (bare, or under a
``"sources"`` key); all three shapes are read.

An endpoint is what the *engine* did with it, not an address to dial: vLLM binds
a PUB socket when the endpoint contains ``*`` or ``::`` (or is ``ipc://`` /
``inproc://``) and *connects* otherwise (``ZmqEventPublisher._is_bind_endpoint``).
So ``tcp://*:5557`` means "listening on every interface, port 5557": a consumer
dials the replica's own host on that port.  ``tcp://127.0.0.1:5557`` means the
engine connected out to port 5557 on itself, where nobody listens; nothing ever
arrives (note that ``0.0.0.0`` connects too under that rule).  ``is_bind_endpoint``
applies vLLM's rule so the balancer can say so instead of waiting in silence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DISCOVERY_PATH = "/kv_event_sources"


@dataclass(frozen=True, slots=True)
class EventSource:
    """One publisher: a data-parallel rank's PUB endpoint and optional replay endpoint."""

    rank: int
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


def parse_event_sources(body: Any) -> list[EventSource]:
    """Every enabled ZMQ publisher in a ``/kv_event_sources`` answer, by rank.

    Raises ``ValueError`` on a body that is none of the known shapes."""
    if isinstance(body, Mapping) and isinstance(body.get("sources"), list):
        entries = [(_rank(e.get("data_parallel_rank")), e) for e in body["sources"]]
    elif isinstance(body, Mapping):
        entries = [(_rank(key), value) for key, value in body.items()]
    elif isinstance(body, list):
        entries = [(_rank(_field(e, "data_parallel_rank")), e) for e in body]
    else:
        raise ValueError(f"kv_event_sources must be an object or a list, got {body!r}")
    sources = [s for rank, entry in entries if (s := _source(rank, entry)) is not None]
    return sorted(sources, key=lambda s: s.rank)


def _field(entry: Any, name: str) -> Any:
    if not isinstance(entry, Mapping):
        raise ValueError(f"a KV event source must be an object, got {entry!r}")
    return entry.get(name)


def _rank(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"a data-parallel rank must be an int, got {value!r}")
    try:
        return int(value if value is not None else 0)
    except (TypeError, ValueError):
        raise ValueError(f"a data-parallel rank must be an int, got {value!r}") from None


def _source(rank: int, entry: Any) -> EventSource | None:
    endpoint = _field(entry, "endpoint")
    publisher = entry.get("publisher", "zmq")
    if entry.get("enable_kv_cache_events") is False or publisher not in ("zmq", None):
        return None  # events off, or a publisher that is not a ZMQ socket
    if not isinstance(endpoint, str) or not endpoint:
        raise ValueError(f"rank {rank}: endpoint must be a string, got {endpoint!r}")
    replay = entry.get("replay_endpoint")
    topic = entry.get("topic") or ""
    return EventSource(
        rank, endpoint, replay if isinstance(replay, str) and replay else None, str(topic)
    )


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: the engine binds this endpoint (else it connects out)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def dial_address(endpoint: str, replica_host: str) -> str:
    """The address a consumer connects to: a wildcard host becomes the replica's host.

    ``tcp://*:5557`` on a replica at ``http://10.0.0.7:8000`` is dialled as
    ``tcp://10.0.0.7:5557``; an explicit host or an ipc path is kept as written."""
    scheme, sep, rest = endpoint.partition("://")
    if scheme != "tcp" or not sep:
        return endpoint
    host, colon, port = rest.rpartition(":")
    if not colon:
        return endpoint
    if host in ("*", "0.0.0.0", "[::]", "::", ""):
        host = f"[{replica_host}]" if ":" in replica_host else replica_host
    return f"tcp://{host}:{port}"
