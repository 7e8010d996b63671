"""The partition drill: forwarding between two regions fails, then heals.

Injection goes through each side's token-protected ``POST /internal/faults``
(``{"partition": [peer balancers], "until": epoch_s}``): every balancer of region A
treats every balancer of region B as unreachable and the other way round, for its
availability polls and its forwards (SkyLB §3.3: a peer whose report ages out is no
longer a forwarding target).  Nothing else breaks: clients of each region keep
being served by its own replicas, and a request that could only be forwarded
fails as it would across a cut link.  The fault carries its own expiry (``until``),
so a drill that dies cannot leave the regions cut off; the drill clears it early
at the end.

Reacted: each side's remote layer reports the other side not alive.  Converged:
each side sees the other alive again after the fault is cleared.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import httpx
from django.conf import settings

from fleet.models import Balancer, DrillRun, Region
from ops import http_probe
from ops.drills.reactions import Reaction, ReactionCheck
from ops.drills.runner import DrillPlan
from ops.drills.targets import DrillError
from routing.internal_auth import install_headers

KIND = DrillRun.Kind.PARTITION
FAULTS_PATH = "/internal/faults"


def partition_bound() -> float:
    """A cut peer stops counting once its last report ages out (one poll may be in
    flight), plus the drill's own poll and slack."""
    s = settings
    return (
        s.MERIDIAN_AVAILABILITY_TTL_S
        + s.MERIDIAN_AVAILABILITY_INTERVAL_S
        + s.MERIDIAN_DRILL_POLL_INTERVAL_S
        + s.MERIDIAN_DRILL_SLACK_S
    )


def converge_bound() -> float:
    s = settings
    return 2 * s.MERIDIAN_AVAILABILITY_INTERVAL_S + s.MERIDIAN_DRILL_SLACK_S


def set_partition(balancer_url: str, peers: Iterable[str], until: float) -> None:
    """``POST /internal/faults`` on one balancer (an empty ``peers`` heals it)."""
    headers = {"Authorization": f"Bearer {settings.MERIDIAN_INTERNAL_TOKEN}"}
    body = {"partition": sorted(peers), "until": until}
    url = balancer_url.rstrip("/") + FAULTS_PATH
    try:
        response = http_probe.post(url, json=body, headers=headers, timeout=5)
    except httpx.HTTPError as exc:
        raise DrillError(f"{balancer_url}: partition not set ({exc})") from exc
    if response.status_code != 200:
        raise DrillError(f"{balancer_url}: partition refused: HTTP {response.status_code}")


def region_balancers(name: str) -> list[Balancer]:
    if not Region.objects.filter(name=name).exists():
        raise DrillError(f"no region {name!r}")
    live = list(Balancer.objects.filter(region__name=name, state=Balancer.State.UP))
    if not live:
        raise DrillError(f"{name} has no live balancer to partition")
    return sorted(live, key=lambda b: b.name)


def peer_alive(url: str, timeout: float = 1.0) -> dict[str, bool] | None:
    """peer name -> alive, as the balancer at ``url`` routes; None if it does not answer."""
    try:
        response = http_probe.get(
            url.rstrip("/") + "/internal/state", timeout=timeout, headers=install_headers()
        )
        response.raise_for_status()
        rows = response.json().get("peers") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return {str(r.get("name")): bool(r.get("alive")) for r in rows if isinstance(r, dict)}


def _links(a: list[Balancer], b: list[Balancer]) -> list[tuple[Balancer, Balancer]]:
    return [(x, y) for x in a for y in b] + [(y, x) for x in a for y in b]


def links_are(a: list[Balancer], b: list[Balancer], *, alive: bool) -> ReactionCheck:
    """Every balancer of one side sees every balancer of the other ``alive`` (or not)."""
    links = _links(a, b)

    def check() -> Reaction:
        views = {x.url: peer_alive(x.url) for x in {x.url: x for x, _ in links}.values()}
        wrong = [
            f"{x.name}->{y.name}"
            for x, y in links
            if (view := views[x.url]) is None or view.get(y.name, False) is not alive
        ]
        state = "alive" if alive else "cut off"
        if wrong:
            return Reaction(False, f"not yet {state}: {', '.join(wrong)}")
        return Reaction(True, f"{len(links)} balancer links {state}")

    return check


def partition_plan(region_a: str, region_b: str, *, duration_s: float) -> DrillPlan:
    if region_a == region_b:
        raise DrillError("--between needs two different regions")
    side_a, side_b = region_balancers(region_a), region_balancers(region_b)

    def cut(until: float) -> None:
        for ours, theirs in ((side_a, side_b), (side_b, side_a)):
            for balancer in ours:
                set_partition(balancer.url, [p.name for p in theirs], until)

    def inject() -> str:
        # The balancers expire the fault on their own a little after the drill ends.
        cut(time.time() + duration_s + partition_bound() + converge_bound())
        return f"forwarding between {region_a} and {region_b} fails for {duration_s:g}s"

    def restore() -> str:
        for balancer in side_a + side_b:
            set_partition(balancer.url, [], 0.0)
        return f"{region_a} and {region_b} reconnected"

    return DrillPlan(
        kind=KIND,
        target=f"{region_a} <-> {region_b}",
        bound_s=partition_bound(),
        inject=inject,
        check=links_are(side_a, side_b, alive=False),
        restore=restore,
        hold_s=duration_s,
        converge=links_are(side_a, side_b, alive=True),
        converge_bound_s=converge_bound(),
    )
