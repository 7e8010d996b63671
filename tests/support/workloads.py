"""Taking programs from workloads, which may be endless."""

from __future__ import annotations

import itertools

from sim.workloads import Program, Workload


def first(workload: Workload, count: int) -> list[Program]:
    """The first ``count`` programs of a (possibly endless) workload."""
    return list(itertools.islice(workload.programs(), count))
