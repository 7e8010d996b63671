"""One client request on its way through the balancer, and where it came from.

``ProxyCall`` is what the completions view admits and the dispatcher sends; the
route labels say which way a request travelled (``route`` in the request metrics)
and the hop header marks a request a peer forwarded to us (never a second hop).
Plain data with no I/O, so the views that build calls import no transport: the
URLconf, which every ``manage.py`` command loads for its checks, stays light.

``ApiRequest`` and ``ProxyResponse`` are what the API's views take and give back:
plain values, no Django objects, so the plain ASGI path (``routing.api_plain``)
and Django's views (``routing.views``) share one implementation.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypeVar, overload

from core.openai_request import CompletionRequest
from core.sse import Usage
from core.types import RequestDescriptor

_T = TypeVar("_T")

HOP_HEADER = "X-Meridian-Forwarded-From"
ROUTE_LOCAL = "local"
ROUTE_FORWARDED_OUT = "forwarded_out"
ROUTE_FORWARDED_IN = "forwarded_in"


@dataclass(slots=True)
class ProxyCall:
    """One client request on its way through the balancer."""

    request: CompletionRequest
    descriptor: RequestDescriptor
    raw_body: bytes
    authorization: str
    request_id: str
    arrived: float  # time.monotonic() when the view started
    # The API key's hold (routing.key_limits.KeyGrant.finish): called once with the
    # usage when the request ends, however it ends; later calls are no-ops.
    on_finish: Callable[[Usage | None], None] | None = None
    rate_limit_headers: Mapping[str, str] = field(default_factory=dict)

    def finish(self, usage: Usage | None) -> None:
        if self.on_finish is not None:
            self.on_finish(usage)

    @property
    def route_in(self) -> str:
        return ROUTE_FORWARDED_IN if self.descriptor.forwarded else ROUTE_LOCAL


class Headers(Mapping[str, str]):
    """Request headers looked up by name in any case (as HTTP names compare)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, str] | None = None) -> None:
        self._values = {name.lower(): value for name, value in (values or {}).items()}

    def __getitem__(self, name: str) -> str:
        return self._values[name.lower()]

    @overload
    def get(self, name: str, /) -> str | None: ...
    @overload
    def get(self, name: str, /, default: str | _T) -> str | _T: ...

    def get(self, name: str, /, default: object = None) -> object:
        # Mapping's own ``get`` goes through ``__getitem__`` and a KeyError for every
        # absent header; the views look up about six per request.
        return self._values.get(name.lower(), default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    @classmethod
    def from_asgi(cls, raw: list[tuple[bytes, bytes]]) -> Headers:
        """An ASGI scope's headers (latin-1, as HTTP/1.1 allows); a repeated header's
        values are joined with commas, as Django joins them."""
        headers = cls()
        values = headers._values
        for name, value in raw:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            values[key] = f"{values[key]},{text}" if key in values else text
        return headers


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """One ``/v1`` request as the views need it: method, path, headers, the connecting
    address (``None`` when the server gave none) and the body (``None``: too large
    for the server to have read it; the views answer 413)."""

    method: str
    path: str
    headers: Headers
    remote_addr: str | None
    body: bytes | None


class ProxyResponse:
    """What a ``/v1`` view answers: status, content type, headers, and either a whole
    body or a stream of chunks (relayed as they come; the stream's own end settles its
    request).  Headers are set and read by name in any case, like a Django response's."""

    __slots__ = ("body", "content_type", "headers", "status", "stream")

    def __init__(
        self,
        status: int,
        content_type: str,
        body: bytes = b"",
        stream: AsyncIterable[bytes] | None = None,
    ) -> None:
        self.status = status
        self.content_type = content_type
        self.body = body
        self.stream = stream
        self.headers: dict[str, tuple[str, str]] = {}  # lower-case name -> (name, value)

    @property
    def status_code(self) -> int:
        return self.status

    def __setitem__(self, name: str, value: str) -> None:
        self.headers[name.lower()] = (name, value)

    def __getitem__(self, name: str) -> str:
        return self.headers[name.lower()][1]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self.headers

    def items(self) -> list[tuple[str, str]]:
        """The headers set on it (not Content-Type), in the order first set."""
        return list(self.headers.values())
