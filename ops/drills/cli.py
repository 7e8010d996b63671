"""What the drill commands share: traffic options, an API key, SIGTERM, the report.

With ``--traffic R`` a drill sends R requests per second to the balancer that serves
the target's region.  The key is ``--api-key``, else ``MERIDIAN_API_KEY``, else a
key issued for this drill alone and revoked when it ends (balancers learn keys at
their topology refresh, so the drill waits until the balancer accepts it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.models import ApiKey
from ops import http_probe
from ops.drills.report import format_run
from ops.drills.runner import DrillOptions, DrillPlan, run_drill
from ops.drills.targets import DrillError
from ops.drills.traffic import TrafficConfig
from routing.internal_auth import install_headers
from workers.ownership import serving_balancer_url


def add_traffic_arguments(parser: CommandParser) -> None:
    parser.add_argument("--traffic", type=float, metavar="R", help="requests per second to send")
    parser.add_argument("--max-requests", type=int, default=200, help="cap on requests sent")
    parser.add_argument("--api-key", default="", help="client key (default: MERIDIAN_API_KEY)")
    parser.add_argument("--model", default="", help="model to request (default: the target's)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of traffic before")
    parser.add_argument("--after", type=float, default=3.0, help="seconds of traffic after")


@contextmanager
def client_key(given: str) -> Iterator[tuple[str, bool]]:
    """(raw key, issued here); a key issued here is revoked on the way out."""
    raw = given or os.environ.get("MERIDIAN_API_KEY", "")
    if raw:
        yield raw, False
        return
    key, raw = ApiKey.issue("drill (temporary)")
    try:
        yield raw, True
    finally:
        # A save, not QuerySet.update: the save is what tells the balancers.
        key.revoked = True
        key.save(update_fields=["revoked"])


def wait_until_accepted(base_url: str, key: str, timeout_s: float, issued_at: float) -> None:
    """Poll ``GET /v1/models`` until the balancer knows ``key`` (a readiness wait), then
    until every process behind its address does.

    Keys are learned at each process's own topology refresh, so one process accepting
    the key says nothing of its siblings on the same port (docs/scale-out.md): the
    drill's first requests would meet a 401 from one that has not refreshed yet.  Each
    process reports when its snapshot was read (``topology_loaded_at``) and how many
    siblings it shares state with; the wait ends once that many distinct processes
    read theirs after ``issued_at``."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < deadline:
        try:
            url = base_url.rstrip("/") + "/v1/models"
            if http_probe.get(url, headers=headers, timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass  # not answering yet: keep waiting until the deadline
        time.sleep(0.1)
    else:
        raise DrillError(f"{base_url} did not accept the drill's API key within {timeout_s:.0f}s")
    if not _every_process_loaded_since(base_url, issued_at, deadline):
        raise DrillError(
            f"not every process of {base_url} refreshed its topology within {timeout_s:.0f}s"
        )


# Answers from a balancer whose only process heard counts no sibling before the drill
# believes it is alone: a sibling would answer one of them with odds 1 - 2**-8.
LONE_PROCESS_ASKS = 8


def _every_process_loaded_since(base_url: str, since: float, deadline: float) -> bool:
    loaded: dict[str, float] = {}  # process -> when its latest snapshot was read
    # The most processes any of them counts.  One that has not met its sibling yet
    # counts only itself: a lone process is believed after several asks, not one.
    wanted, heard = 1, 0
    while time.monotonic() < deadline:
        state = _internal_state(base_url)  # a fresh connection: the kernel picks a process
        if state is not None:
            heard += 1
            shared = (state.get("redis") or {}).get("shared_state")
            process, sharing = "only", isinstance(shared, dict)
            if isinstance(shared, dict):
                process = str(shared.get("process"))
                wanted = max(wanted, 1 + int(shared.get("peers", 0)))
            loaded[process] = float(state.get("topology_loaded_at") or 0.0)
            fresh = sum(1 for at in loaded.values() if at >= since)
            sure = wanted > 1 or not sharing or heard >= LONE_PROCESS_ASKS
            if fresh >= max(wanted, len(loaded)) and sure:
                return True
        time.sleep(0.05)
    return False


def _internal_state(base_url: str) -> dict[str, Any] | None:
    try:
        response = http_probe.get(
            base_url.rstrip("/") + "/internal/state",
            headers=install_headers(),
            timeout=2,
        )
        response.raise_for_status()
        state = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return state if isinstance(state, dict) else None


@contextmanager
def sigterm_sets(stop: threading.Event) -> Iterator[None]:
    """SIGTERM ends the drill cleanly (fault restored, run recorded as aborted)."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# A drill's plan, the region whose clients its traffic plays, and the model they ask for.
Prepared = tuple[DrillPlan, str, str]


def run_reported(
    command: BaseCommand, prepare: Callable[[], Prepared], options: dict[str, Any]
) -> None:
    """Prepare the plan, run it (with traffic if asked), print the report.  Refusals
    and unmet preconditions become ``CommandError`` (exit status 1, no traceback), and
    so does a drill that did not pass, after its report."""
    stop = threading.Event()
    try:
        plan, region, model = prepare()
        with client_key(options["api_key"]) as (key, issued), sigterm_sets(stop):
            drill_options = _drill_options(options, region, options["model"] or model, key, issued)
            echo = command.stdout.write if options.get("verbosity", 1) >= 2 else None
            run = run_drill(plan, drill_options, stop=stop, echo=echo)
    except DrillError as exc:
        raise CommandError(str(exc)) from exc
    command.stdout.write(format_run(run))
    if run.outcome != run.Outcome.PASSED:
        raise CommandError(f"drill {run.kind} #{run.pk}: {run.outcome}")


def _drill_options(
    options: dict[str, Any], region: str, model: str, key: str, issued: bool
) -> DrillOptions:
    issued_at = time.time()  # after the key's commit (client_key issued it already)

    def resolve() -> str | None:
        return serving_balancer_url(region)

    traffic = None
    if options["traffic"]:
        url = resolve()
        if url is None:
            raise DrillError(f"no live balancer serves {region}: nowhere to send traffic")
        if issued:
            wait_until_accepted(
                url, key, settings.MERIDIAN_TOPOLOGY_REFRESH_S * 3 + 5, issued_at=issued_at
            )
        traffic = TrafficConfig(
            api_key=key, model=model, rate=options["traffic"], max_requests=options["max_requests"]
        )
    return DrillOptions(
        traffic=traffic,
        resolve_url=resolve,
        warmup_s=options["warmup"],
        after_s=options["after"],
        poll_s=settings.MERIDIAN_DRILL_POLL_INTERVAL_S,
    )
