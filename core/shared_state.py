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

Staleness: peers' load is at most ``sync_s`` plus one exchange old while the store
answers and either side is busy; news that ends a quiet spell is seen within
``idle_check_s`` plus one exchange (``ExchangePacer``). When an exchange fails (or
takes longer than its timeout) the view is *degraded*: peers' load is dropped at
once and decisions use the local view only, exactly a single process's behaviour;
routes decided meanwhile wait in a bounded outbox (oldest dropped first, counted)
and go out when the store answers again, and the log cursor resumes where it
stopped, so processes converge without a restart.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

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
    # Longest wait between two "anything new?" checks of an idle process; 0: no
    # pacing, the full exchange every ``sync_s`` (``ExchangePacer``).  Above
    # ``heartbeat_s`` it changes nothing: the heartbeat comes first.
    idle_check_s: float = 0.4

    def __post_init__(self) -> None:
        if self.sync_s <= 0 or self.timeout_s <= 0:
            raise ValueError("sync_s and timeout_s must be positive")
        if self.peer_ttl_s <= self.sync_s:
            raise ValueError("peer_ttl_s must exceed sync_s, or live peers would expire")
        if min(self.routes_maxlen, self.outbox_max, self.read_batch) < 1:
            raise ValueError("routes_maxlen, outbox_max and read_batch must be at least 1")
        if self.idle_check_s and self.idle_check_s < self.sync_s:
            raise ValueError("idle_check_s must be 0 (no pacing) or at least sync_s")

    @property
    def heartbeat_s(self) -> float:
        """Longest time between two full exchanges of a live process: a third of the
        peer TTL, so two lost heartbeats in a row do not get it dropped."""
        return self.peer_ttl_s / 3 if self.idle_check_s else self.sync_s


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


# -- encoding ------------------------------------------------------------------------------
# Loads: JSON (a few replicas, readable with redis-cli).  Routes: packed bytes,
# ``model NUL target NUL`` then the block hashes as little-endian unsigned 64-bit
# words: a 128-block route is 1 KiB copied in one call either way, instead of 128
# numbers printed and parsed as JSON.  No pickle on a shared store.

_WORD = 8
_SWAP = sys.byteorder != "little"


def encode_loads(loads: Mapping[str, ReplicaLoad]) -> str:
    return json.dumps(
        {name: [load.outstanding, load.unconfirmed] for name, load in sorted(loads.items())},
        separators=(",", ":"),
    )


def decode_loads(raw: str | bytes) -> dict[str, ReplicaLoad]:
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


def encode_route(record: RouteRecord) -> bytes:
    """``record`` packed; SharedStateError for a name with NUL or a block hash outside
    unsigned 64 bits (what ``core.blocks`` produces)."""
    if "\0" in record.model or "\0" in record.target or not record.model or not record.target:
        raise SharedStateError("route record model and target must be non-empty, without NUL")
    try:
        words = array("Q", record.blocks)
    except (OverflowError, TypeError) as exc:
        raise SharedStateError(f"route record blocks must be unsigned 64-bit: {exc}") from exc
    if _SWAP:
        words.byteswap()
    return b"".join((record.model.encode(), b"\0", record.target.encode(), b"\0", words.tobytes()))


def decode_route(raw: bytes) -> RouteRecord:
    parts = raw.split(b"\0", 2)
    if len(parts) != 3:
        raise SharedStateError(f"route record must be model NUL target NUL blocks: {raw[:80]!r}")
    model_raw, target_raw, packed = parts
    if not model_raw or not target_raw:
        raise SharedStateError("route record model and target must be non-empty")
    if len(packed) % _WORD or len(packed) > _WORD * MAX_BLOCKS_PER_ROUTE:
        raise SharedStateError(
            f"route record blocks must be whole 64-bit words, at most {MAX_BLOCKS_PER_ROUTE}"
        )
    try:
        model, target = model_raw.decode(), target_raw.decode()
    except UnicodeDecodeError as exc:
        raise SharedStateError(f"route record names are not UTF-8: {exc}") from exc
    words = array("Q")
    words.frombytes(packed)
    if _SWAP:
        words.byteswap()
    return RouteRecord(model, target, tuple(words))


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
    # The balancer's version counter as this exchange left it (``ExchangePacer``).
    version: int | None = None


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


# -- pacing: nothing exchanged while nothing changed ---------------------------------------


class Step(Enum):
    """What the glue does at one tick of its ``sync_s`` loop."""

    FULL = "full"  # the exchange script: publish, stamp, read siblings
    CHECK = "check"  # read the balancer's version counter only (one GET)
    WAIT = "wait"  # nothing


@dataclass(slots=True)
class ExchangePacer:
    """When a process runs its full exchange, and when a cheap check is enough.

    Every successful full exchange that changes what siblings would read (a new
    snapshot, routes appended, a dead process dropped) bumps the balancer's version
    counter; a process remembers the version its last exchange left.  At each tick:

    * something changed locally (routes waiting, a different load snapshot), the
      view is degraded, or no exchange has succeeded yet: **full**, at once;
    * the last full exchange is ``heartbeat_s`` old: **full** (the stamp that keeps
      this process alive for its siblings);
    * the next check is due: **check** the version, and run the full exchange if
      it moved.  A quiet check doubles the time to the next one, from ``sync_s`` up
      to ``idle_check_s``; a full exchange that moved the counter brings it back
      to ``sync_s``.  While news keeps coming, a due tick skips the check for the
      full exchange (``hot``), until one brings nothing new.

    So a busy process exchanges every ``sync_s`` as before, and an idle one costs a
    GET every ``idle_check_s`` and a full exchange every ``heartbeat_s``; its loop
    sleeps until then (``delay_s``) unless a decision wakes it.  A change that is not
    a decision (a request finishing, a probe) waits for that wake-up: within
    ``sync_s`` while busy, ``idle_check_s`` once quiet.  Staleness
    of siblings' state: ``sync_s`` while either side is busy (a change is published
    at the next tick and checked for within ``sync_s`` of the last change seen),
    at most ``idle_check_s`` (plus a round trip) for news that ends a quiet spell.
    ``idle_check_s == 0`` turns pacing off: the full exchange every tick."""

    config: SharedConfig
    last_full: float | None = None
    next_check: float = 0.0
    interval: float = 0.0
    version: int | None = None
    full_runs: int = 0
    checks: int = 0
    # The last check or full exchange found news: while that lasts a due check is
    # skipped for the full exchange itself (a sibling is busy: one round trip, not two).
    hot: bool = False

    def step(self, now: float, *, local_changed: bool, degraded: bool) -> Step:
        config = self.config
        if not config.idle_check_s or local_changed or degraded or self.last_full is None:
            return Step.FULL
        if now - self.last_full >= config.heartbeat_s:
            return Step.FULL
        if now < self.next_check:
            return Step.WAIT
        return Step.FULL if self.hot else Step.CHECK

    def on_full(self, now: float, version: int | None) -> None:
        """A full exchange succeeded and left the counter at ``version``.  One that moved
        it (this process published, or news arrived) brings back the fast period; a
        heartbeat that moved nothing keeps the checks' backoff."""
        self.full_runs += 1
        moved = version != self.version
        self.hot = self.hot and moved
        if moved or not self.interval:
            self.interval = self.config.sync_s
        self.last_full, self.version = now, version
        self.next_check = now + self.interval

    def delay_s(self, now: float, *, degraded: bool) -> float:
        """How long the loop may sleep before its next tick, unless a decision of this
        process wakes it first: the sync period while busy or degraded, else until the
        next check or heartbeat is due."""
        config = self.config
        if not config.idle_check_s or degraded or self.last_full is None:
            return config.sync_s
        due = min(self.next_check, self.last_full + config.heartbeat_s)
        return max(config.sync_s, due - now)

    def on_check(self, now: float, version: int | None) -> Step:
        """The counter read ``version``: FULL when a sibling published since."""
        self.checks += 1
        if version is None or version != self.version:
            self.hot = True
            return Step.FULL
        self.interval = min(2 * self.interval, self.config.idle_check_s)
        self.next_check = now + self.interval
        return Step.WAIT

    @property
    def idle(self) -> bool:
        """True once checks have backed off to their longest period."""
        return bool(self.config.idle_check_s) and self.interval >= self.config.idle_check_s
