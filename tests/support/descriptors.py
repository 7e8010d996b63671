"""Inputs for the routing core's tests: targets, request descriptors, block-hash prefixes.

Plain functions rather than fixtures because hypothesis tests cannot take
function-scoped fixtures, and core tests need no database, settings or processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import count
from typing import Any

from core.types import RequestDescriptor, TargetState

_ids = count()


def target(target_id: str, **fields: Any) -> TargetState:
    """A target as the balancer passes it to a policy: healthy, idle unless told."""
    return TargetState(target_id=target_id, url=f"http://{target_id}.test", **fields)


def targets(n: int, prefix: str = "r") -> list[TargetState]:
    return [target(f"{prefix}{i}") for i in range(n)]


def request(
    blocks: Sequence[int] = (), *, session: str = "", lora: str | None = None
) -> RequestDescriptor:
    return RequestDescriptor(
        request_id=f"req-{next(_ids)}",
        model="m",
        prompt_tokens=16 * len(blocks),
        block_hashes=tuple(blocks),
        session_key=session,
        lora=lora,
    )


def prefix(tag: int, n: int, base: Sequence[int] = ()) -> tuple[int, ...]:
    """``base`` followed by ``n`` block hashes unique to ``tag`` (a stand-in for chained hashes)."""
    return (*base, *(tag * 1_000_003 + i + 1 for i in range(n)))
