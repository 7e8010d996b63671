"""Sending a drill's traffic: a small, bounded request stream, as a real client would.

Requests go through the official ``openai`` client with its retries on (connection
errors, 408/409/429/5xx, with its own backoff), so a drill measures what clients
with an ordinary SDK experience.  An httpx event hook counts the HTTP attempts of
each call, which is how "retried" (succeeded after at least one retry) is told
from "succeeded" (first attempt) and "failed" (the SDK gave up).

Arrivals are paced at ``rate`` per second (open loop) onto a pool of worker threads,
at most ``max_requests`` in all.  ``base_url`` may be changed while the stream runs:
the drill points it at whichever balancer serves the region now (after a
failover, the one that took the region over), as ``/internal/topology`` tells
clients.  Worker threads never touch the database.

This is the only drill module that imports the SDK, the costliest import in the
project: the drill commands, the console's drill catalog and the URLconf that every
``manage.py`` command loads for its checks stay clear of it (``ops.drills.runner``
imports this module when a drill starts traffic).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from ops.drills.traffic import RequestRecord, TrafficConfig


class _Attempts(threading.local):
    count = 0


class TrafficStream:
    def __init__(self, config: TrafficConfig, base_url: str) -> None:
        if config.rate <= 0:
            raise ValueError("traffic rate must be positive")
        self.config = config
        self.base_url = base_url
        self.records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._attempts = _Attempts()
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix="drill-traffic")
        self._pacer = threading.Thread(target=self._pace, name="drill-pacer", daemon=True)

    def start(self) -> None:
        self._pacer.start()

    def stop(self, *, wait_s: float = 60.0) -> list[RequestRecord]:
        """Stop sending; wait (bounded) for requests in flight; return every record."""
        self._stop.set()
        self._pacer.join(timeout=wait_s)
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            for client in self._clients:
                client.close()
            return sorted(self.records, key=lambda r: r.number)

    def _pace(self) -> None:
        interval = 1.0 / self.config.rate
        started = time.monotonic()
        for number in range(self.config.max_requests):
            delay = started + number * interval - time.monotonic()
            if self._stop.wait(max(0.0, delay)):
                return
            # The URL and the send time are fixed here, at arrival: a request that
            # waits for a free worker still went where clients were told at that time.
            self._pool.submit(self._send, number, self.base_url, time.monotonic())

    def _http(self) -> httpx.Client:
        """This worker thread's client (a pool per thread; all closed by ``stop``)."""
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            hooks = {"request": [self._count_attempt]}
            client = httpx.Client(event_hooks=hooks, trust_env=False)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def _count_attempt(self, request: httpx.Request) -> None:
        self._attempts.count += 1

    def _send(self, number: int, base_url: str, sent: float) -> None:
        cfg = self.config
        client = openai.OpenAI(
            base_url=base_url.rstrip("/") + "/v1",
            api_key=cfg.api_key,
            max_retries=cfg.max_retries,
            timeout=cfg.timeout_s,
            # openai takes an httpx client too (it checks for one at run time); its
            # annotation names only httpx2's.
            http_client=self._http(),  # type: ignore[arg-type]
        )
        self._attempts.count = 0
        try:
            raw = client.completions.with_raw_response.create(
                model=cfg.model,
                prompt=f"Drill request {number}: say something.",
                max_tokens=cfg.max_tokens,
            )
            raw.parse()
        except openai.OpenAIError as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
            end = time.monotonic()
            self._keep(
                RequestRecord(number, sent, end, False, self._attempts.count, base_url, error=error)
            )
            return
        self._keep(
            RequestRecord(
                number,
                sent,
                time.monotonic(),
                True,
                self._attempts.count,
                base_url,
                balancer=raw.headers.get("x-meridian-balancer"),
                replica=raw.headers.get("x-meridian-replica"),
            )
        )

    def _keep(self, record: RequestRecord) -> None:
        with self._lock:
            self.records.append(record)
