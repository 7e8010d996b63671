"""Routing state shared by the N balancer processes behind one address (Higress, 001).

Higress lets every gateway node see global least-request counts and one prefix
index through Redis.  Here each process keeps deciding on its own event loop,
from a *local view*, and the glue (``routing.shared_state``) exchanges that view
with its siblings in one Redis script per sync period: never a round trip inside
a decision.  This module is the pure half: what a process publishes, how peers'
reports merge into its view, how old that view may grow, and what it does when
the exchange fails.

Two kinds of state are shared, under two merge rules:

* **Load** (global least-request and SP-P push accounting): each process
  publishes a *snapshot* of its own ``(outstanding, unconfirmed)`` per replica,
  stamped by the store's clock.  A peer's view of a replica is the *sum of the
  other processes' latest snapshots*; its own part comes from its own ledger,
  which is exact.  Snapshots, not increments: a process that dies stops
  publishing and its counts vanish with its stamp (no counter can drift, the
  anti-pattern of STYLE.md), and a lost sync is repaired by the next one.
* **Routes** (the prefix index): every decision appends ``(model, replica,
  block chain)`` to a bounded, ordered log.  Each process replays its peers'
  records into its own policy's prefix structure (``learn_route``: the SkyLB
  trie, the SGLang/Meridian radix tree, the cache map's speculative entries),
  so the shared index obeys exactly the bounds and eviction rules of that
  structure.  The log itself holds the latest ``routes_maxlen`` records; a
  process that starts replays it before taking traffic (warm start).

Staleness: peers' load is at most ``sync_s`` plus one exchange old while the
store answers.  When an exchange fails (or takes longer than its timeout) the
view is *degraded*: peers' load is dropped at once and decisions use the local
view only, exactly a single process's behaviour; routes decided meanwhile wait
in a bounded outbox (oldest dropped first, counted) and go out when the store
answers again, and the log cursor resumes where it stopped, so processes
converge without a restart.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_BLOCKS_PER_ROUTE = 4096
START_CURSOR = "0-0"


class SharedStateError(ValueError):
    """A shared-state record that cannot be read (written by a bug or another version)."""


@dataclass(frozen=True, slots=True)
class SharedConfig:
    """How often processes exchange their view and how much of it is kept."""

    sync_s: float = 0.05
    timeout_s: float = 0.25
    peer_ttl_s: float = 2.0
    routes_maxlen: int = 4096
    outbox_max: int = 4096
    read_batch: int = 512

    def __post_init__(self) -> None:
        if self.sync_s <= 0 or self.timeout_s <= 0:
            raise ValueError("sync_s and timeout_s must be positive")
        if self.peer_ttl_s <= self.sync_s:
            raise ValueError("peer_ttl_s must exceed sync_s, or live peers would expire")
        if min(self.routes_maxlen, self.outbox_max, self.read_batch) < 1:
            raise ValueError("routes_maxlen, outbox_max and read_batch must be at least 1")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One process's requests on one replica: outstanding, and pushed since its probe."""

    outstanding: int = 0
    unconfirmed: int = 0


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """A decision: ``blocks`` (a chained block-hash path) of ``model`` went to ``target``."""

    model: str
    target: str
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LoggedRoute:
    """A route record as the log returned it: its position and the process that wrote it."""

    entry_id: str
    process: str
    record: RouteRecord


# -- encoding (JSON: small, readable with redis-cli, no pickle on a shared store) -------


def encode_loads(loads: Mapping[str, ReplicaLoad]) -> str:
    return json.dumps(
        {name: [load.outstanding, load.unconfirmed] for name, load in sorted(loads.items())},
        separators=(",", ":"),
    )


def decode_loads(raw: str) -> dict[str, ReplicaLoad]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise SharedStateError(f"load report is not JSON: {raw[:80]!r}") from exc
    if not isinstance(body, dict):
        raise SharedStateError(f"load report must be an object, not {type(body).__name__}")
    out: dict[str, ReplicaLoad] = {}
    for name, pair in body.items():
        if not isinstance(pair, list) or len(pair) != 2 or not all(_count(v) for v in pair):
            raise SharedStateError(f"load of {name!r} must be two counts >= 0, not {pair!r}")
        out[name] = ReplicaLoad(pair[0], pair[1])
    return out


def encode_route(record: RouteRecord) -> str:
    return json.dumps([record.model, record.target, list(record.blocks)], separators=(",", ":"))


def decode_route(raw: str) -> RouteRecord:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise SharedStateError(f"route record is not JSON: {raw[:80]!r}") from exc
    if not isinstance(body, list) or len(body) != 3:
        raise SharedStateError("route record must be [model, target, blocks]")
    model, target, blocks = body
    if not isinstance(model, str) or not isinstance(target, str) or not model or not target:
        raise SharedStateError("route record model and target must be non-empty strings")
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS_PER_ROUTE:
        raise SharedStateError(f"route record blocks must be a list of <= {MAX_BLOCKS_PER_ROUTE}")
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in blocks):
        raise SharedStateError("route record blocks must be integers")
    return RouteRecord(model, target, tuple(blocks))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# -- merge rules --------------------------------------------------------------------------


def merge_peer_loads(reports: Mapping[str, Mapping[str, ReplicaLoad]]) -> dict[str, ReplicaLoad]:
    """Peers' load per replica: the sum of every other live process's latest snapshot.

    ``reports`` holds only the *other* processes, already filtered to live ones
    (their stamp younger than ``peer_ttl_s`` by the store's clock)."""
    outstanding: dict[str, int] = {}
    unconfirmed: dict[str, int] = {}
    for loads in reports.values():
        for name, load in loads.items():
            outstanding[name] = outstanding.get(name, 0) + load.outstanding
            unconfirmed[name] = unconfirmed.get(name, 0) + load.unconfirmed
    return {name: ReplicaLoad(outstanding[name], unconfirmed[name]) for name in outstanding}


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What the store answered to one exchange."""

    peers: Mapping[str, Mapping[str, ReplicaLoad]]
    routes: Sequence[LoggedRoute]
    # Log entries read (readable or not) and the id of the last one: the next cursor.
    read: int = 0
    last_id: str | None = None
    unreadable: int = 0


@dataclass(slots=True)
class SharedView:
    """One process's view of its siblings; the glue feeds it exchanges and failures.

    No clock: the glue passes ``now`` (monotonic seconds) where age matters."""

    process: str
    config: SharedConfig = field(default_factory=SharedConfig)
    cursor: str = START_CURSOR
    peer_loads: dict[str, ReplicaLoad] = field(default_factory=dict)
    peers: int = 0
    # None until the first exchange succeeds; then the time of the latest success.
    last_ok: float | None = None
    degraded: bool = True
    # True once the log has been read to its end at least once (warm start done).
    caught_up: bool = False
    published: int = 0
    applied: int = 0
    dropped: int = 0
    failures: int = 0
    skipped_records: int = 0
    _outbox: deque[RouteRecord] = field(default_factory=deque)

    def record_route(self, record: RouteRecord) -> None:
        """A decision of this process, to publish at the next exchange."""
        if len(record.blocks) > MAX_BLOCKS_PER_ROUTE:
            record = RouteRecord(record.model, record.target, record.blocks[:MAX_BLOCKS_PER_ROUTE])
        self._outbox.append(record)
        while len(self._outbox) > self.config.outbox_max:
            self._outbox.popleft()
            self.dropped += 1

    @property
    def pending(self) -> int:
        return len(self._outbox)

    def take_outbox(self) -> list[RouteRecord]:
        """Everything waiting to be published (given back by ``on_failure`` if it fails)."""
        out = list(self._outbox)
        self._outbox.clear()
        return out

    def on_success(self, now: float, result: SyncResult, sent: int) -> list[RouteRecord]:
        """Adopt an exchange's answer; the peers' routes to learn, oldest first."""
        self.last_ok, self.degraded = now, False
        self.published += sent
        self.peers = len(result.peers)
        self.peer_loads = merge_peer_loads(result.peers)
        learn = [r.record for r in result.routes if r.process != self.process]
        if result.last_id is not None:
            self.cursor = result.last_id
        self.applied += len(learn)
        self.skipped_records += result.unreadable
        if result.read < self.config.read_batch:
            self.caught_up = True
        return learn

    def on_failure(self, unsent: Iterable[RouteRecord]) -> None:
        """The exchange failed or timed out: local view only until one succeeds again."""
        self.failures += 1
        self.degraded = True
        self.peer_loads = {}
        self.peers = 0
        self._outbox.extendleft(reversed(list(unsent)))
        while len(self._outbox) > self.config.outbox_max:
            self._outbox.popleft()
            self.dropped += 1

    def staleness_s(self, now: float) -> float | None:
        """Age of peers' load (None: never exchanged)."""
        return None if self.last_ok is None else max(0.0, now - self.last_ok)
