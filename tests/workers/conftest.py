"""Topology rows for control-plane tests: regions with latencies, balancers, replicas."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleet.models import Balancer, Region, RegionLatency, Replica, Zone


@dataclass
class Rows:
    """Creates rows inside the test's transaction (unit tests, no child processes)."""

    def region(self, name: str) -> Region:
        region = Region.objects.create(name=name)
        Zone.objects.create(region=region, name=f"{name}-1a")
        return region

    def rtt(self, a: Region, b: Region, ms: float) -> None:
        RegionLatency.objects.create(source=a, target=b, rtt_ms=ms)
        RegionLatency.objects.create(source=b, target=a, rtt_ms=ms)

    def balancer(self, name: str, region: Region, *, state: str = "up", url: str = "") -> Balancer:
        return Balancer.objects.create(
            name=name, region=region, url=url or f"http://127.0.0.1:1/{name}", state=state
        )

    def replica(self, name: str, region: Region, *, url: str = "", **fields: object) -> Replica:
        defaults: dict[str, object] = {"state": Replica.State.READY, "model_name": "m"}
        return Replica.objects.create(
            name=name,
            url=url or f"http://127.0.0.1:1/{name}",
            region=region,
            zone=region.zones.get(),
            **{**defaults, **fields},
        )


@pytest.fixture
def rows(db: None) -> Rows:
    return Rows()


class FakeServer:
    """A loopback HTTP server answering canned responses by (method, path)."""

    def __init__(self) -> None:
        self.responses: dict[tuple[str, str], tuple[int, str]] = {}
        self.requests: list[tuple[str, str, bytes]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                server.requests.append((self.command, self.path, self.rfile.read(length)))
                status, body = server.responses.get((self.command, self.path), (404, ""))
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, status: int, body: str = "") -> None:
        self.responses[(method, path)] = (status, body)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer()
    yield server
    server.close()
