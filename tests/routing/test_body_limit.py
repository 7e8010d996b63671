from __future__ import annotations

import asyncio
import json
from typing import Any

from routing.body_limit import BodyLimitMiddleware


class RecordingApp:
    def __init__(self) -> None:
        self.calls = 0
        self.body = b""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run(
    middleware: BodyLimitMiddleware,
    headers: list[tuple[bytes, bytes]],
    chunks: list[bytes],
    path: str = "/v1/completions",
) -> tuple[list[dict[str, Any]], int]:
    incoming = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    consumed = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal consumed
        consumed += 1
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "headers": headers}
    asyncio.run(middleware(scope, receive, send))
    return sent, consumed


def test_declared_oversize_body_is_refused_without_reading_it() -> None:
    app = RecordingApp()
    sent, consumed = run(BodyLimitMiddleware(app, 100), [(b"content-length", b"5000")], [b"x"])
    assert (app.calls, consumed) == (0, 0)
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"


def test_undeclared_body_is_refused_once_it_passes_the_limit() -> None:
    app = RecordingApp()
    chunks = [b"x" * 60] * 10
    sent, consumed = run(BodyLimitMiddleware(app, 100), [], chunks)
    assert app.calls == 0 and consumed == 2  # stopped at the chunk that crossed the limit
    assert sent[0]["status"] == 413


def test_bodies_within_the_limit_reach_the_app_intact() -> None:
    app = RecordingApp()
    run(BodyLimitMiddleware(app, 100), [], [b"abc", b"def"])
    assert (app.calls, app.body) == (1, b"abcdef")
    declared = RecordingApp()
    run(BodyLimitMiddleware(declared, 100), [(b"content-length", b"3")], [b"xyz"])
    assert declared.body == b"xyz"


def test_console_paths_are_not_limited() -> None:
    app = RecordingApp()
    run(BodyLimitMiddleware(app, 1), [(b"content-length", b"50")], [b"x" * 50], path="/admin/")
    assert app.calls == 1
