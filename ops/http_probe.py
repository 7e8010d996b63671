"""Operator tools' HTTP to balancers and replicas: one client, a fresh connection per request.

``httpx.get`` builds a client per call, and every client loads the CA bundle into a
new SSL context: about 40 ms of CPU per call, for plain HTTP on loopback.  A drill
asks the balancers several times a second, each process behind a shared port over
its own connection.  On a busy host those 40 ms grew to hundreds of milliseconds per
request, a check took seconds, and the Redis-outage drill could miss the 2 s pause
it was watching.  One client for the process costs about 1.5 ms a request.

Keep-alive is off on purpose: every request opens its own connection, so it reaches
whichever process the kernel picks for it (``SO_REUSEPORT``), and a balancer killed
by a drill is noticed at the next request instead of on a pooled socket.
"""

from __future__ import annotations

import functools
from typing import Any

import httpx


@functools.cache
def client() -> httpx.Client:
    """The process's probe client (httpx's sync pool is safe to share across threads)."""
    return httpx.Client(trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))


def get(url: str, **options: Any) -> httpx.Response:
    return client().get(url, **options)


def post(url: str, **options: Any) -> httpx.Response:
    return client().post(url, **options)
