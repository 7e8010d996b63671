"""The engine suite's handles: a real vLLM replica, the fleet behind the balancer, and a
subscriber that reads a replica's KV-event stream the way the balancer does."""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import msgpack
import openai
import zmq
from tokenizers import Tokenizer

from core.kv_events import STORED
from ops import http_probe
from tests.support.balancers import state
from tests.support.polling import eventually


@dataclass(frozen=True)
class VllmReplica:
    name: str
    port: int
    publish_port: int  # KV events (ZMQ PUB, bound by vLLM)
    replay_port: int  # vLLM's replay service for missed sequence numbers (ZMQ ROUTER)
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class EngineFleet:
    url: str  # the balancer
    key: str
    model: str
    replicas: dict[str, VllmReplica]
    model_dir: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=60)

    def direct_client(self, replica: str) -> openai.OpenAI:
        """A client of one replica itself, behind the balancer's back."""
        base = f"{self.replicas[replica].url}/v1"
        return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))

    def prompt_ids(self, prompt: str) -> list[int]:
        """The token ids vLLM computes for a completions prompt (BOS added)."""
        return list(self.tokenizer.encode(prompt).ids)

    def complete(self, prompt: str, **extra: Any) -> tuple[str, Any]:
        """A completion through the balancer: (the replica that served it, the response)."""
        raw = self.client().completions.with_raw_response.create(
            model=self.model, prompt=prompt, max_tokens=1, temperature=0, **extra
        )
        return raw.headers["X-Meridian-Replica"], raw.parse()

    def replica_state(self, replica: str) -> dict[str, Any]:
        return next(r for r in state(self.url)["replicas"] if r["name"] == replica)

    def kv_stream_state(self, replica: str) -> dict[str, Any]:
        rows: dict[str, dict[str, Any]] = state(self.url)["kv_events"]["replicas"]
        return rows[replica]


_TAGS = itertools.count()
_FILLER = ("cache", "route", "block", "queue", "token", "region")


def unique_prompt(words: int = 120) -> str:
    """A prompt no other request of the session starts with (so no cache hit by accident)."""
    tag = next(_TAGS)
    filler = " ".join(_FILLER[i % len(_FILLER)] for i in range(words))
    return f"prompt {tag} of the session: {filler}"


def prompt_blocks_only(fleet: EngineFleet, words: int, block_size: int) -> str:
    """A unique prompt that ends inside a block, and not one token short of its end: the
    engine caches full blocks of prompt *and* output, so a prompt one short would also
    store a block holding the sampled token (max_tokens=1), and when repeated, one ending
    on a block boundary recomputes (and may store again) its last block, since the last
    prompt token is always computed. Any other length stores exactly the prompt's full
    blocks, once."""
    while True:
        prompt = unique_prompt(words)
        if len(fleet.prompt_ids(prompt)) % block_size not in (0, block_size - 1):
            return prompt


def wait_applied(fleet: EngineFleet, replica: str, received_before: int) -> None:
    """The balancer received messages past ``received_before`` and applied them all."""

    def applied() -> bool:
        row = fleet.kv_stream_state(replica)
        return row["received"] > received_before and row["pending"] == 0

    eventually(applied, what=f"the balancer applied {replica}'s new events", timeout=30)


def balancer_hears(
    fleet: EngineFleet, replica: str, timeout_s: float = 60.0, row: str | None = None
) -> None:
    """Send throwaway prompts to ``replica`` until the balancer receives their events
    on the stream of replica row ``row`` (default: the row named as the engine).
    Until then its subscription may not be live yet (ZMQ subscriptions propagate
    asynchronously), and the first message it does receive is never judged a gap."""
    client = fleet.direct_client(replica)
    stream = row or replica
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = fleet.kv_stream_state(stream)["received"]
        client.completions.create(model=fleet.model, prompt=unique_prompt(60), max_tokens=1)
        try:
            eventually(
                lambda: fleet.kv_stream_state(stream)["received"] > before,
                what="an event received",
                timeout=2,
            )
        except AssertionError:
            continue
        wait_applied(fleet, stream, before)
        return
    raise AssertionError(f"the balancer received no KV event of {stream} in {timeout_s}s")


def seed(fleet: EngineFleet, replica: str, prompt: str) -> None:
    """Cache ``prompt`` on ``replica`` behind the balancer's back: the balancer can only
    learn of it from the replica's KV events."""
    balancer_hears(fleet, replica)
    before = fleet.kv_stream_state(replica)["received"]
    fleet.direct_client(replica).completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
    wait_applied(fleet, replica, before)


def cached_tokens(usage: Any) -> int:
    details = usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


def reusable_tokens(prompt_tokens: int, block_size: int) -> int:
    """What a warm prefix cache can give a repeated prompt: vLLM matches full blocks
    among all but the last prompt token (that one is always computed, for its logits)."""
    return (prompt_tokens - 1) // block_size * block_size


@dataclass(frozen=True)
class RawMessage:
    """One KV-event message as the wire carries it: the frames, and the payload unpacked
    (vLLM sends each event as a map with a ``type`` key)."""

    frames: list[bytes]
    events: list[dict[str, Any]]


class EventTap:
    """A ZMQ SUB socket on a replica's publisher, collecting every message it sees."""

    def __init__(self, endpoint: str) -> None:
        self._socket = zmq.Context.instance().socket(zmq.SUB)
        self._socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(endpoint)
        self.messages: list[RawMessage] = []

    def drain(self, wait_s: float = 0.5) -> list[RawMessage]:
        """Read what has arrived, waiting up to ``wait_s`` for the first message."""
        fresh = []
        timeout_ms = int(wait_s * 1000)
        while self._socket.poll(timeout_ms):
            frames = self._socket.recv_multipart()
            body = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
            fresh.append(RawMessage(frames, list(body[1])))
            timeout_ms = 50  # the rest of a burst comes at once
        self.messages.extend(fresh)
        return fresh

    def stored_until(
        self, done: Callable[[list[dict[str, Any]]], bool], *, what: str
    ) -> list[dict[str, Any]]:
        """The BlockStored events read from now on, once ``done`` says all it waits for
        are in.  Each engine step publishes its own message, so the events of several
        requests come spread out, further apart than one burst on a busy machine."""
        stored: list[dict[str, Any]] = []

        def complete() -> bool:
            fresh = self.drain(wait_s=0.2)
            stored.extend(e for m in fresh for e in m.events if e["type"] == STORED)
            return done(stored)

        eventually(complete, what=what)
        return stored

    def close(self) -> None:
        self._socket.close()


@contextmanager
def event_tap(replica: VllmReplica) -> Iterator[EventTap]:
    """A subscriber on ``replica``'s publisher, closed on exit. ZMQ subscriptions
    propagate asynchronously: ``settle`` it before relying on it to see everything."""
    tap = EventTap(f"tcp://127.0.0.1:{replica.publish_port}")
    try:
        yield tap
    finally:
        tap.close()


def settle(tap: EventTap, fleet: EngineFleet, replica: str, timeout_s: float = 60.0) -> None:
    """Send distinct throwaway prompts to ``replica`` until ``tap`` sees their events:
    from then on the subscription is live and nothing published is missed."""
    client = fleet.direct_client(replica)
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while time.monotonic() < deadline:
        attempt += 1
        prompt = f"settle {replica} {attempt} " + "queue batch " * 24
        client.completions.create(model=fleet.model, prompt=prompt, max_tokens=1)
        if tap.drain():
            return
    raise AssertionError(f"no KV event from {replica} within {timeout_s}s")


def engine_metrics(replica: VllmReplica) -> str:
    return http_probe.get(f"{replica.url}/metrics", timeout=10).text
