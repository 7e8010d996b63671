"""Find where a replica publishes its KV events: configuration, else ``GET /kv_event_sources``.

An endpoint named in the service's ``policy_params["kv_events"]`` is the address to
dial, as the operator wrote it (a ``*`` host is read as the replica's host).
Otherwise the replica is asked: vLLM 0.32 and the emulated replica both serve
``GET /kv_event_sources`` (``core.kv_sources`` reads it).  The lowest
data-parallel rank's publisher is used: one Meridian replica is one URL, and a
data-parallel vLLM behind one URL is one replica to route to.

An advertised endpoint vLLM would *connect* with (no ``*``) is reported back as
such, so the consumer can say so instead of dialling an address nobody binds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from core.kv_sources import (
    DISCOVERY_PATH,
    dial_address,
    is_bind_endpoint,
    parse_event_sources,
)
from routing.upstream import join_url

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Discovered:
    """A replica's publisher: what it advertised, and where to dial it and its replay."""

    advertised: str
    endpoint: str
    replay_endpoint: str | None
    binds: bool  # False: the engine connects out, so nothing can be received


def replica_host(url: str) -> str:
    return urlsplit(url).hostname or "127.0.0.1"


def from_config(url: str, configured: str) -> Discovered:
    """An operator's endpoint is the address to dial; whether the engine binds it
    cannot be told from here (the silent-stream check covers that)."""
    return Discovered(configured, dial_address(configured, replica_host(url)), None, True)


async def discover(client: httpx.AsyncClient, url: str, *, timeout_s: float) -> Discovered | None:
    """The replica's answer, or None when it publishes nothing (or cannot be asked)."""
    try:
        response = await client.get(join_url(url, DISCOVERY_PATH), timeout=timeout_s)
        if response.status_code != 200:
            return None
        sources = parse_event_sources(response.json())
    except (httpx.HTTPError, ValueError) as exc:
        logger.debug("KV event discovery at %s failed: %s", url, exc)
        return None
    if not sources:
        return None
    source, host = sources[0], replica_host(url)
    replay = dial_address(source.replay_endpoint, host) if source.replay_endpoint else None
    return Discovered(
        source.endpoint,
        dial_address(source.endpoint, host),
        replay,
        is_bind_endpoint(source.endpoint),
    )
