"""The ASGI callables' types, shared by the balancer's ASGI pieces.

They are the types Django's own ``ASGIHandler`` declares (django-stubs): a scope is a
dict, messages are read-only mappings either way.  ``BodyLimitMiddleware`` wraps
``by_path_prefix``, which hands requests to ``ApiASGIHandler`` or to Django's handler,
so one set of types lets each be passed where the next is expected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
