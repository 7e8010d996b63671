"""The one rule every probe applies: a success makes a target healthy at once, and
``threshold`` consecutive failures make it unhealthy (one failure is noise)."""

from __future__ import annotations


def after_probe(
    ok: bool, *, current: str, failures: int, threshold: int, healthy: str, unhealthy: str
) -> tuple[str, int]:
    """The new state and consecutive-failure count after one probe."""
    if ok:
        return healthy, 0
    failures += 1
    return (unhealthy if failures >= threshold else current), failures
