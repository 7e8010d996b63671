"""A loopback HTTP server that answers what the test scripted, for code that calls
balancers and replicas over HTTP (probes, scrapes, drill traffic)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Canned:
    status: int
    body: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    # Seconds the server takes before it answers (a busy replica's status page).
    delay_s: float = 0.0


NOT_FOUND = Canned(404)


class FakeServer:
    """Answers canned responses by (method, path); anything unscripted gets a 404.

    ``requests`` records every request as (method, path, body)."""

    def __init__(self) -> None:
        self.scripts: dict[tuple[str, str], list[Canned]] = {}
        self.requests: list[tuple[str, str, bytes]] = []
        # The handler runs on the server's threads while the test scripts on its own.
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, status: int, body: str = "") -> None:
        """Answer every ``method path`` from now on with this response."""
        self.answer_in_turn(method, path, Canned(status, body))

    def answer_in_turn(self, method: str, path: str, *responses: Canned) -> None:
        """Answer the next requests with ``responses`` in order; the last one repeats."""
        with self._lock:
            self.scripts[(method, path)] = list(responses)

    def take(self, method: str, path: str, body: bytes) -> Canned:
        with self._lock:
            self.requests.append((method, path, body))
            script = self.scripts.get((method, path))
            if not script:
                return NOT_FOUND
            return script.pop(0) if len(script) > 1 else script[0]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler_for(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            canned = server.take(self.command, self.path, self.rfile.read(length))
            time.sleep(canned.delay_s)  # on this request's own thread
            data = canned.body.encode()
            self.send_response(canned.status)
            for name, value in canned.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            return

    return Handler
