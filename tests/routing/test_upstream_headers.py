"""An upstream response's headers read exactly as ``httpx.Headers`` reads them.

``routing.upstream_pool.ResponseHeaders`` replaced ``httpx.Headers`` on the relay's
path; here both read the same raw header lists (names in any case, repeated names,
ASCII, UTF-8 and other bytes) and must give the same answers.
"""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from routing.upstream_pool import ResponseHeaders

NAMES = ["content-type", "Content-Type", "X-Meridian-Replica", "x-meridian-replica", "X-Other"]
LOOKUPS = [*NAMES, "CONTENT-TYPE", "absent", "x-meridian-balancer"]
VALUES = st.one_of(
    st.sampled_from([b"application/json", b"text/event-stream", b"", b"a, b"]),
    st.binary(max_size=8),
    st.text(max_size=6).map(str.encode),  # UTF-8, sometimes not ASCII
)
RAW = st.lists(st.tuples(st.sampled_from([n.encode() for n in NAMES]), VALUES), max_size=6)


def _reads(headers: httpx.Headers | ResponseHeaders, name: str) -> tuple[object, ...]:
    try:
        item: object = headers[name]
    except KeyError:
        item = KeyError
    return item, headers.get(name), headers.get(name, "fallback"), name in headers


@given(RAW)
def test_every_lookup_answers_as_httpx_headers_does(raw: list[tuple[bytes, bytes]]) -> None:
    ours, theirs = ResponseHeaders(list(raw)), httpx.Headers(list(raw))
    for name in LOOKUPS:
        assert _reads(ours, name) == _reads(theirs, name)


@pytest.mark.parametrize(
    "raw",
    [
        [(b"Content-Type", b"text/plain; charset=\xc3\xa9")],  # UTF-8
        [(b"Content-Type", b"caf\xe9"), (b"X-Other", b"\xc3\xa9")],  # then ISO-8859-1
        [(b"X-Meridian-Replica", b"a"), (b"x-meridian-replica", b"b")],  # joined
    ],
)
def test_encodings_and_repeats(raw: list[tuple[bytes, bytes]]) -> None:
    ours, theirs = ResponseHeaders(raw), httpx.Headers(raw)
    for name in LOOKUPS:
        assert _reads(ours, name) == _reads(theirs, name)
