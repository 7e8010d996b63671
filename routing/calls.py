"""One client request on its way through the balancer, and where it came from.

``ProxyCall`` is what the completions view admits and the dispatcher sends; the
route labels say which way a request travelled (``route`` in the request metrics)
and the hop header marks a request a peer forwarded to us (never a second hop).
Plain data with no I/O, so the views that build calls import no transport: the
URLconf, which every ``manage.py`` command loads for its checks, stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from routing.core.openai_request import CompletionRequest
from routing.core.sse import Usage
from routing.core.types import RequestDescriptor

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
