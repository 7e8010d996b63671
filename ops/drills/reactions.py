"""When has routing reacted?  Predicates over balancers' ``GET /internal/state``.

Each check looks at what the balancers themselves say they route to (their
``replicas`` rows), not at the database: the database changes first, and the point
of a drill is the moment clients' requests stop reaching the broken thing.

* ``replicas_left_routing``: no balancer lists the replicas as healthy any more
  (a preempted replica was dropped at a topology refresh or failed its probes).
* ``replicas_taken_over``: answering balancers list every one of them (failover
  handed a dead balancer's replicas to a live one, SkyLB §4.2, or the dead one is
  back).
* ``TrafficMovedAway``: traffic left a slowed replica, as an operator sees it on
  the balancers' own per-replica counters: its share of the requests dispatched
  since the fault fell below half the share it had before the fault.
  (Internal load signals can say "loaded" while traffic still flows to it, and
  traffic can move while no single poll catches the load: the share is the fact.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from ops import http_probe
from ops.drills.judging import traffic_share
from routing.internal_auth import install_headers


@dataclass(frozen=True)
class Reaction:
    reacted: bool
    detail: str


ReactionCheck = Callable[[], Reaction]


def replica_rows(url: str, *, timeout: float = 1.0) -> list[dict[str, Any]] | None:
    """The balancer's replica rows, or None when it does not answer."""
    try:
        response = http_probe.get(
            url.rstrip("/") + "/internal/state",
            timeout=timeout,
            headers=install_headers(),
        )
        response.raise_for_status()
        state = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    rows = state.get("replicas") if isinstance(state, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def replicas_left_routing(balancer_urls: Iterable[str], names: Iterable[str]) -> ReactionCheck:
    urls, wanted = sorted(set(balancer_urls)), set(names)

    def check() -> Reaction:
        still = []
        for url in urls:
            rows = replica_rows(url)
            if rows is None:
                return Reaction(False, f"{url} does not answer")
            still += [
                f"{r['name']}@{url}" for r in rows if r.get("name") in wanted and r.get("healthy")
            ]
        if still:
            return Reaction(False, "still routed: " + ", ".join(sorted(still)))
        return Reaction(True, f"no balancer routes to {', '.join(sorted(wanted))}")

    return check


def replicas_taken_over(live_urls: Iterable[str], names: Iterable[str]) -> ReactionCheck:
    urls, wanted = sorted(set(live_urls)), set(names)

    def check() -> Reaction:
        owners: dict[str, str] = {}
        for url in urls:
            for row in replica_rows(url) or []:
                if row.get("name") in wanted:
                    owners.setdefault(str(row["name"]), url)
        missing = wanted - set(owners)
        if missing:
            return Reaction(
                False, "not yet routed by a live balancer: " + ", ".join(sorted(missing))
            )
        where = sorted(set(owners.values()))
        return Reaction(True, f"{', '.join(sorted(wanted))} now routed by {', '.join(where)}")

    return check


def dispatched_by_replica(urls: Iterable[str], name: str) -> dict[str, int] | None:
    """Requests each balancer dispatched to every replica of ``name``'s model (those
    finished plus those outstanding, from its own counters), summed over balancers;
    None when no balancer answers."""
    totals: dict[str, int] = {}
    answered = False
    for url in urls:
        rows = replica_rows(url)
        if rows is None:
            continue
        answered = True
        model = next((r.get("model") for r in rows if r.get("name") == name), None)
        for row in rows:
            if model is not None and row.get("model") == model:
                sent = int(row.get("requests") or 0) + int(row.get("outstanding") or 0)
                key = str(row["name"])
                totals[key] = totals.get(key, 0) + sent
    return totals if answered else None


class TrafficMovedAway:
    """Reacted when the slowed replica's share of the requests dispatched since the
    fault fell below half the share it had before (its fair share when too little
    was dispatched before to tell): what an operator sees on the balancer's
    per-replica request counters (``ops.drills.judging.traffic_share``).

    ``mark`` takes the counters at injection; a check before any mark takes them
    then."""

    def __init__(self, balancer_urls: Iterable[str], name: str, *, min_dispatched: int) -> None:
        self.urls, self.name = sorted(set(balancer_urls)), name
        self.min_dispatched = min_dispatched
        self.before: dict[str, int] | None = None

    def mark(self) -> None:
        self.before = dispatched_by_replica(self.urls, self.name) or {}

    def __call__(self) -> Reaction:
        now = dispatched_by_replica(self.urls, self.name)
        if now is None:
            return Reaction(False, "no balancer answers")
        if self.before is None:
            self.before = now
        share = traffic_share(self.before, now, self.name, min_before=self.min_dispatched)
        if share is None:
            return Reaction(False, f"no balancer routes {self.name}")
        moved = share.moved_away(min_dispatched=self.min_dispatched)
        return Reaction(moved, share.describe(self.name))
