"""A request's headers as the views read them (``routing.calls.Headers``)."""

from __future__ import annotations

from routing.calls import Headers


def test_headers_are_read_in_any_case_and_absent_ones_give_the_default() -> None:
    headers = Headers.from_asgi([(b"X-Session-ID", b"s1"), (b"accept", b"a"), (b"Accept", b"b")])
    assert headers.get("x-session-id") == headers["X-SESSION-ID"] == "s1"
    assert headers.get("ACCEPT") == "a,b"  # repeated: joined with commas, as Django does
    assert headers.get("X-Request-ID") is None
    assert headers.get("X-Request-ID", "") == ""
    assert "x-session-id" in headers
    assert "x-request-id" not in headers
    assert Headers({"Content-Type": "application/json"}).get("content-type") == "application/json"
