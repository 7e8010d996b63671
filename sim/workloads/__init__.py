"""Workloads: client sessions ("programs") to replay against Meridian or simulate.

Pure Python (no Django, no HTTP), shared by ``manage.py replay`` and the
discrete-event simulator.  Start at ``parse_workload("conversations", seed=1)``
and ``choose_arrivals``; see ``program`` for the data model.
"""

from __future__ import annotations

from sim.workloads.arrivals import (
    DEFAULT_RATE,
    Arrivals,
    ClosedLoop,
    ClosedLoopDispatcher,
    OpenLoop,
    choose_arrivals,
    poisson_offsets,
)
from sim.workloads.program import (
    ApiKind,
    Message,
    Program,
    ReplyOf,
    Request,
    Step,
    TraceFormatError,
    Workload,
)
from sim.workloads.registry import WORKLOAD_NAMES, WorkloadSpecError, parse_workload

__all__ = [
    "DEFAULT_RATE",
    "WORKLOAD_NAMES",
    "ApiKind",
    "Arrivals",
    "ClosedLoop",
    "ClosedLoopDispatcher",
    "Message",
    "OpenLoop",
    "Program",
    "ReplyOf",
    "Request",
    "Step",
    "TraceFormatError",
    "Workload",
    "WorkloadSpecError",
    "choose_arrivals",
    "parse_workload",
    "poisson_offsets",
]
