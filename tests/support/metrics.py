"""Reading a server's Prometheus ``/metrics`` the way a scraper would."""

from __future__ import annotations

from core.prom_text import parse
from ops import http_probe


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples at ``url``/metrics whose labels include ``labels``;
    a series that is not there fails the test (a misspelt name must not read as 0)."""
    text = http_probe.get(f"{url}/metrics", timeout=5).text
    wanted = set(labels.items())
    found = [s.value for s in parse(text) if s.name == name and wanted <= set(s.labels)]
    if not found:
        raise AssertionError(f"{name} {labels} not in {url}/metrics")
    return sum(found)
