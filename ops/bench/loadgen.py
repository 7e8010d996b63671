"""The proxy benchmark's load generator: a lean HTTP/1.1 client in its own process.

It runs apart from the command (``python -m ops.bench.loadgen``) so that it
shares no GIL with anything it measures, and speaks HTTP/1.1 over raw asyncio
streams rather than through httpx: per request it writes one pre-encoded head
and body and reads the response with a handful of ``readuntil``/``readexactly``
calls, so the client costs as little CPU per token as Python allows and the
direct baseline is limited by the backends, not by the client.

Protocol with the parent: one JSON ``Phase`` per line on stdin, one JSON result
per line on stdout, until stdin closes.  Only loopback-style URLs the parent
passes are contacted; every loop is bounded by a request count or a deadline.

What is measured per request: time to the first body byte (for a streaming
chat request that is the role chunk, which vLLM and the emulated replica send
before the first token, and which the balancer only relays once the upstream
produced it) and time to the end of the body.  A request succeeds when it gets
HTTP 200 and, when streaming, a body that ends in ``data: [DONE]`` (the
balancer ends a stream that failed mid-way with an error event instead).

Connections stay alive between requests, but one left idle longer than
``KEEPALIVE_EXPIRY_S`` is closed and opened anew before its next request, as
httpx's pool does (``keepalive_expiry``).  Servers close idle connections
after a few seconds (uvicorn's default, the balancer's and the emulated
replicas': 5 s), and a request written onto one as it closes fails with no
answer.  Against the backends directly, each worker keeps one connection per
backend and uses each in turn, so on a slow machine some idled past 5 s and
the direct baseline failed requests that no server had read.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

_DONE = b"data: [DONE]"
# Below the idle timeout of every server the bench talks to (5 s; see above).
KEEPALIVE_EXPIRY_S = 2.0


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured run: ``requests`` requests (or until ``duration_s``) at ``concurrency``."""

    label: str
    targets: list[str]  # base URLs; requests go round-robin over them
    path: str
    bodies: list[str]  # JSON bodies, used in turn
    concurrency: int
    requests: int
    duration_s: float
    stream: bool
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 60.0


@dataclass(slots=True)
class PhaseResult:
    label: str
    ok: int = 0
    errors: int = 0
    first_error: str = ""
    elapsed_s: float = 0.0
    tokens: int = 0
    bytes: int = 0
    client_cpu_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)


class HttpError(Exception):
    pass


class _Connection:
    """One keep-alive HTTP/1.1 connection to one target, reopened after idling
    ``expiry_s`` (the server may be closing it)."""

    def __init__(self, host: str, port: int, expiry_s: float = KEEPALIVE_EXPIRY_S) -> None:
        self.host, self.port = host, port
        self.expiry_s = expiry_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.idle_since = 0.0  # since it was opened or its last response ended

    async def ensure_open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.writer is not None and time.monotonic() - self.idle_since > self.expiry_s:
            self.close()
        if self.reader is None or self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.idle_since = time.monotonic()
        return self.reader, self.writer

    def released(self) -> None:
        """Its response was read whole: it idles from now."""
        self.idle_since = time.monotonic()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass(slots=True)
class _Target:
    host: str
    port: int
    head: bytes  # request line and headers, up to and excluding Content-Length


def _target(base_url: str, path: str, headers: dict[str, str]) -> _Target:
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    prefix = parts.path.rstrip("/")
    if prefix.endswith("/v1") and path.startswith("/v1/"):
        prefix = prefix[:-3]
    lines = [f"POST {prefix}{path} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines += ["Content-Type: application/json", "Accept-Encoding: identity"]
    return _Target(host, port, ("\r\n".join(lines) + "\r\n").encode())


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    status_line, *header_lines = raw[:-4].split(b"\r\n")
    parts = status_line.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise HttpError(f"bad status line {status_line[:80]!r}")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _read_body(
    reader: asyncio.StreamReader, headers: dict[bytes, bytes]
) -> tuple[float, bytes, int]:
    """(first body byte time, last bytes of the body, body length)."""
    if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
        first, tail, total = 0.0, b"", 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return first, tail, total
            if not first:
                first = time.perf_counter()
            total += size
            tail = (tail + data[:-2])[-64:]
    length = headers.get(b"content-length")
    data = await (reader.readexactly(int(length)) if length is not None else reader.read())
    return time.perf_counter(), data, len(data)


async def _one(conn: _Connection, target: _Target, body: bytes, stream: bool) -> tuple[float, int]:
    """Send one request; (time to first body byte, body bytes).  HttpError on failure."""
    reader, writer = await conn.ensure_open()
    started = time.perf_counter()
    writer.write(target.head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    status, headers = await _read_head(reader)
    first, tail, size = await _read_body(reader, headers)
    conn.released()
    if headers.get(b"connection", b"").lower() == b"close":
        conn.close()
    if status != 200:
        raise HttpError(f"HTTP {status}: {tail[-200:].decode(errors='replace')}")
    if stream and _DONE not in tail:
        raise HttpError(f"stream ended without [DONE]: {tail.decode(errors='replace')}")
    return first - started, size


class _Worker:
    """One closed-loop client: sends a request, waits for all of it, sends the next."""

    def __init__(self, phase: Phase, targets: list[_Target], result: PhaseResult) -> None:
        self.phase, self.targets, self.result = phase, targets, result
        self.conns = [_Connection(t.host, t.port) for t in targets]
        self.bodies = [body.encode() for body in phase.bodies]

    async def run(self, tickets: list[int], deadline: float, tokens_each: int) -> None:
        phase = self.phase
        try:
            while tickets and time.perf_counter() < deadline:
                n = tickets.pop()
                index = n % len(self.targets)
                body = self.bodies[n % len(self.bodies)]
                started = time.perf_counter()
                try:
                    ttft, size = await asyncio.wait_for(
                        _one(self.conns[index], self.targets[index], body, phase.stream),
                        phase.timeout_s,
                    )
                except (
                    TimeoutError,
                    OSError,
                    asyncio.IncompleteReadError,
                    HttpError,
                    ValueError,
                ) as exc:
                    self.conns[index].close()
                    self._failed(exc)
                    continue
                self.result.ok += 1
                self.result.ttft_s.append(ttft)
                self.result.e2e_s.append(time.perf_counter() - started)
                self.result.bytes += size
                self.result.tokens += tokens_each
        finally:
            for conn in self.conns:
                conn.close()

    def _failed(self, exc: BaseException) -> None:
        self.result.errors += 1
        if not self.result.first_error:
            self.result.first_error = f"{type(exc).__name__}: {exc}"[:300]


def _tokens_per_request(phase: Phase) -> int:
    """Completion tokens each successful request carries (the bodies set ``ignore_eos``)."""
    body = json.loads(phase.bodies[0])
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)


async def run_phase(phase: Phase) -> PhaseResult:
    result = PhaseResult(phase.label)
    targets = [_target(url, phase.path, phase.headers) for url in phase.targets]
    # Without a duration the request count bounds the loop; with one, the deadline does
    # (and the count stays a bound too, at a generous rate).
    bound = phase.requests if phase.duration_s <= 0 else max(phase.requests, 1_000_000)
    tickets = list(range(bound - 1, -1, -1))
    deadline = time.perf_counter() + (phase.duration_s if phase.duration_s > 0 else 3600.0)
    tokens_each = _tokens_per_request(phase)
    cpu, started = time.process_time(), time.perf_counter()
    workers = [_Worker(phase, targets, result) for _ in range(phase.concurrency)]
    await asyncio.gather(*(w.run(tickets, deadline, tokens_each) for w in workers))
    result.elapsed_s = time.perf_counter() - started
    result.client_cpu_s = time.process_time() - cpu
    return result


def main() -> None:
    """Serve phases from stdin until it closes; one JSON result line per phase."""
    for line in sys.stdin:
        if not line.strip():
            continue
        spec: dict[str, Any] = json.loads(line)
        result = asyncio.run(run_phase(Phase(**spec)))
        sys.stdout.write(json.dumps(asdict(result)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
