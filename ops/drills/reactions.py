"""When has routing reacted?  Predicates over balancers' ``GET /internal/state``.

Each check looks at what the balancers themselves say they route to (their
``replicas`` rows), not at the database: the database changes first, and the point
of a drill is the moment clients' requests stop reaching the broken thing.

* ``replicas_left_routing``: no balancer lists the replicas as healthy any more
  (a preempted replica was dropped at a topology refresh or failed its probes).
* ``replicas_taken_over``: answering balancers list every one of them (failover
  handed a dead balancer's replicas to a live one, SkyLB §4.2, or the dead one is
  back).
* ``replica_avoided``: the balancer's view of a slowed replica shows the load that
  makes load-aware selection prefer other replicas: unhealthy, reported
  unavailable, requests waiting in its engine, or more requests outstanding on it
  than on the least-loaded healthy replica of its model, on ``polls`` consecutive
  polls (one poll can catch a healthy replica mid-request by chance; a slowed one
  stays busy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from routing.internal_auth import install_headers


@dataclass(frozen=True)
class Reaction:
    reacted: bool
    detail: str


ReactionCheck = Callable[[], Reaction]


def replica_rows(url: str, *, timeout: float = 1.0) -> list[dict[str, Any]] | None:
    """The balancer's replica rows, or None when it does not answer."""
    try:
        response = httpx.get(
            url.rstrip("/") + "/internal/state",
            timeout=timeout,
            trust_env=False,
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


def _loaded(row: dict[str, Any], peers: list[dict[str, Any]]) -> str | None:
    """Why selection would now prefer other replicas over ``row``, if it would."""
    if not row.get("healthy", True):
        return "unhealthy"
    if row.get("available") is False:
        return "unavailable"
    if int(row.get("waiting") or 0) > 0:
        return f"{row['waiting']} waiting in its engine"
    healthy = [int(p.get("outstanding") or 0) for p in peers if p.get("healthy")]
    outstanding = int(row.get("outstanding") or 0)
    if healthy and outstanding > min(healthy):
        return f"{outstanding} outstanding vs {min(healthy)} on the least-loaded replica"
    return None


def _why_loaded(urls: list[str], name: str) -> str | None:
    for url in urls:
        rows = replica_rows(url) or []
        row = next((r for r in rows if r.get("name") == name), None)
        if row is None:
            continue
        peers = [r for r in rows if r is not row and r.get("model") == row.get("model")]
        why = _loaded(row, peers)
        if why:
            return f"{url} sees {name} loaded: {why}"
    return None


def replica_avoided(balancer_urls: Iterable[str], name: str, *, polls: int = 2) -> ReactionCheck:
    urls = sorted(set(balancer_urls))
    streak: list[str] = []

    def check() -> Reaction:
        why = _why_loaded(urls, name)
        if why is None:
            streak.clear()
            return Reaction(False, f"no balancer sees {name} loaded yet")
        streak.append(why)
        return Reaction(len(streak) >= polls, why)

    return check
