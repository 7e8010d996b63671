"""The Redis-outage drill: Redis stops answering everyone for a while, then returns.

``CLIENT PAUSE <ms> ALL`` (Redis ≥ 6.2) holds every client's commands for ``ms``
milliseconds: balancers' heartbeats, the Celery broker and the console all stall
exactly as if Redis were unreachable, yet nothing is killed, no data is lost, and
the server resumes on its own when the time is up, even if the drill dies.  Before
6.2 the command takes no mode and pauses every client anyway (the same outage).
Redis offers no early end that a paused client could send (``CLIENT UNPAUSE``
waits behind the pause like any other command), so a stopped drill still lasts its
whole duration.  Only a loopback Redis is paused (a drill never stalls a shared
server elsewhere), for at most ``MERIDIAN_DRILL_REDIS_MAX_S``.

What should happen (SkyLB §3.3: routing runs on HTTP polls, not on Redis):

* reacted: every live balancer reports Redis unreachable in ``/internal/state``
  (``redis.connected`` false: its next heartbeat timed out), and goes on routing
  on local state and peer polls; the drill's traffic keeps succeeding;
* converged: after the pause every balancer reports Redis reachable with its
  peers' heartbeats back, and every balancer the database had up is up.

A balancer served by N processes behind one port (docs/scale-out.md) is checked
process by process: the drill counts each balancer's processes before the pause
(one plus the siblings a process shares state with), then asks its address over
fresh connections, which the kernel spreads over the processes, until it has
heard every one of them.  Each must also report its shared state degraded during
the pause (routing on its local view) and sharing again with all its siblings
after it.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis
from django.conf import settings

from fleet.models import Balancer, DrillRun
from ops import http_probe
from ops.drills.reactions import Reaction, ReactionCheck
from ops.drills.runner import DrillPlan
from ops.drills.targets import DrillError
from routing.internal_auth import install_headers

KIND = DrillRun.Kind.REDIS_OUTAGE
# Fresh connections per process asked before giving up on hearing all of them (the
# kernel spreads connections by a hash: 12 per process miss one with odds < 1/4000).
SAMPLES_PER_PROCESS = 12


def outage_bound() -> float:
    """A balancer notices at its next heartbeat, which times out after at most 2 s."""
    s = settings
    interval = s.MERIDIAN_HEARTBEAT_INTERVAL_S
    return (
        interval
        + max(0.2, min(interval, 2.0))
        + s.MERIDIAN_DRILL_POLL_INTERVAL_S
        + (s.MERIDIAN_DRILL_SLACK_S)
    )


def converge_bound() -> float:
    s = settings
    return (
        2 * s.MERIDIAN_HEARTBEAT_INTERVAL_S
        + s.MERIDIAN_BALANCER_SYNC_PERIOD_S
        + (s.MERIDIAN_DRILL_SLACK_S)
    )


def _client(url: str) -> redis.Redis:
    host = (urlsplit(url).hostname or "").lower()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise DrillError(f"refusing to pause Redis at {url}: not a loopback address")
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)


def pause_command(version: str, millis: int) -> list[str | int]:
    """``CLIENT PAUSE`` for this server version (the ALL mode exists from 6.2 on)."""
    major, minor = (int(part) for part in [*version.split("."), "0"][:2])
    mode = ["ALL"] if (major, minor) >= (6, 2) else []
    return ["CLIENT", "PAUSE", millis, *mode]


def pause_redis(url: str, duration_s: float) -> str:
    client = _client(url)
    try:
        version = str(client.info("server")["redis_version"])
        command = pause_command(version, int(duration_s * 1000))
        client.execute_command(*command)
    except redis.RedisError as exc:
        raise DrillError(f"Redis at {url} could not be paused: {exc}") from exc
    finally:
        client.close()
    return f"{' '.join(map(str, command))} on Redis {version} at {url}"


def wait_redis_back(url: str, timeout_s: float) -> str:
    """Poll PING until Redis answers (the pause is over) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            if client.ping():
                return "Redis answers again"
        except redis.RedisError:
            time.sleep(0.1)  # still paused: ask again
        finally:
            client.close()
    return f"Redis still silent {timeout_s:.0f}s after the pause should have ended"


ViewReader = Callable[[str], dict[str, Any] | None]


def redis_views(
    url: str, processes: int | None, samples: int = 0, read: ViewReader | None = None
) -> dict[str, dict[str, Any]]:
    """The ``redis`` views of up to ``processes`` distinct processes serving ``url``,
    by process id (a balancer without shared state counts as one process), asking
    at most ``samples`` times (default: ``SAMPLES_PER_PROCESS`` per process).
    ``processes`` None: as many as answer in all ``samples`` asks.  ``read``: how one
    process is asked (default ``redis_view``); any view with the process's
    ``shared_state`` will do, as ``/health``'s answer does."""
    views: dict[str, dict[str, Any]] = {}
    for _ in range(samples or SAMPLES_PER_PROCESS * (processes or 1)):
        view = (read or redis_view)(url)
        if view is None:
            continue
        shared = view.get("shared_state")
        process = str(shared.get("process")) if isinstance(shared, dict) else url
        views[process] = view
        if processes is not None and len(views) >= processes:
            break
    return views


def every_process_sharing(url: str, processes: int, read: ViewReader | None = None) -> bool:
    """Every one of the ``processes`` behind ``url`` answers, each sharing state with
    all the others (not just the first to answer: one that has not exchanged since
    its sibling started still counts no sibling).  ``read`` as for ``redis_views``."""
    views = redis_views(url, processes, read=read)
    return len(views) == processes and all(_sharing(v, processes) for v in views.values())


def process_counts(balancers: Iterable[Balancer]) -> dict[str, int]:
    """Processes behind each balancer's address, as its processes report them now: the
    most any of them counts (itself and its live siblings), or how many answered if
    more.  One process's count alone can read low: a process that has not exchanged
    since its sibling started does not know of it yet."""
    counts = {}
    for b in balancers:
        views = redis_views(b.url, None, samples=SAMPLES_PER_PROCESS)
        siblings = [
            int(v["shared_state"].get("peers", 0))
            for v in views.values()
            if isinstance(v.get("shared_state"), dict)
        ]
        counts[b.name] = max(len(views), 1 + max(siblings, default=0))
    return counts


def _degraded(view: dict[str, Any]) -> bool:
    shared = view.get("shared_state")
    return not isinstance(shared, dict) or shared.get("degraded") is True


def _sharing(view: dict[str, Any], processes: int) -> bool:
    shared = view.get("shared_state")
    if not isinstance(shared, dict):
        return processes == 1
    return shared.get("degraded") is False and shared.get("peers") == processes - 1


def redis_view(url: str) -> dict[str, Any] | None:
    try:
        response = http_probe.get(
            url.rstrip("/") + "/internal/state",
            timeout=1.0,
            headers=install_headers(),
        )
        response.raise_for_status()
        view = response.json().get("redis")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return view if isinstance(view, dict) else None


def redis_seen_down(balancers: Iterable[Balancer], counts: dict[str, int]) -> ReactionCheck:
    chosen = list(balancers)

    def check() -> Reaction:
        for b in chosen:
            want = counts.get(b.name, 1)
            views = redis_views(b.url, want)
            if len(views) < want:
                return Reaction(False, f"{b.name}: heard {len(views)} of {want} processes")
            for process, view in views.items():
                if view.get("connected") is not False:
                    return Reaction(False, f"{b.name} ({process}) still reports Redis reachable")
                if not _degraded(view):
                    return Reaction(False, f"{b.name} ({process}) still shares state with siblings")
        total = sum(counts.get(b.name, 1) for b in chosen)
        return Reaction(
            True, f"{len(chosen)} balancers ({total} processes) report Redis down, routing on"
        )

    return check


def redis_back(balancers: Iterable[Balancer], counts: dict[str, int]) -> ReactionCheck:
    chosen = list(balancers)
    names = {b.name for b in chosen}

    def check() -> Reaction:
        for b in chosen:
            want = counts.get(b.name, 1)
            views = redis_views(b.url, want)
            if len(views) < want:
                return Reaction(False, f"{b.name}: heard {len(views)} of {want} processes")
            for process, view in views.items():
                beats = set(view.get("heartbeats") or ())
                if view.get("connected") is not True or not (names - {b.name}) <= beats:
                    return Reaction(False, f"{b.name}: Redis or peers' heartbeats not back yet")
                if not _sharing(view, want):
                    return Reaction(False, f"{b.name} ({process}): not sharing with siblings yet")
        down = Balancer.objects.filter(pk__in=[b.pk for b in chosen], state=Balancer.State.DOWN)
        if down.exists():
            return Reaction(False, "marked down: " + ", ".join(d.name for d in down))
        return Reaction(True, f"{len(chosen)} balancers see Redis and each other's heartbeats")

    return check


def redis_outage_plan(duration_s: float, *, redis_url: str | None = None) -> DrillPlan:
    url = redis_url or settings.REDIS_URL
    if not 0 < duration_s <= settings.MERIDIAN_DRILL_REDIS_MAX_S:
        raise DrillError(
            f"--duration must be in (0, {settings.MERIDIAN_DRILL_REDIS_MAX_S:g}] seconds"
        )
    _client(url).close()  # refuse a non-loopback Redis before anything is recorded
    live = list(Balancer.objects.filter(state=Balancer.State.UP).order_by("name"))
    if not live:
        raise DrillError("no live balancer to watch")
    counts = process_counts(live)

    return DrillPlan(
        kind=KIND,
        target=f"redis {urlsplit(url).netloc} for {duration_s:g}s",
        bound_s=outage_bound(),
        inject=lambda: pause_redis(url, duration_s),
        check=redis_seen_down(live, counts),
        restore=lambda: wait_redis_back(url, converge_bound()),
        hold_s=duration_s,
        converge=redis_back(live, counts),
        converge_bound_s=converge_bound(),
    )
