"""Reading a server's Prometheus ``/metrics`` the way a scraper would."""

from __future__ import annotations

import httpx

from routing.core.prom_text import parse


def metric(url: str, name: str, *, missing_ok: bool = False, **labels: str) -> float:
    """The sum of ``name``'s samples at ``url``/metrics whose labels include ``labels``.

    A series that is not there yet fails the test, unless ``missing_ok`` (a labelled
    counter appears only once it was first incremented, so absent then means 0)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    wanted = set(labels.items())
    found = [s.value for s in parse(text) if s.name == name and wanted <= set(s.labels)]
    if not found and not missing_ok:
        raise AssertionError(f"{name} {labels} not in {url}/metrics")
    return sum(found)
