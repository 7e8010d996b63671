"""What one balancer knows about the world, as plain immutable values.

The glue (``routing.topology``) reads the database in the background and builds a
``TopologySnapshot``; the request path only ever reads the latest snapshot from
memory.  Keeping these as frozen dataclasses means a refresh is one reference
swap between awaits, so a request never sees half a topology.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.availability import PushingConfig
from core.key_limits import KeyLimits


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """A routable replica this balancer owns."""

    name: str
    url: str
    model: str
    region: str
    zone: str
    kind: str
    # Round trip from this balancer (0: unknown or in its region).  A balancer may own
    # replicas far away (failover, a single balancer for every region): the cost model
    # prices this round trip and learns prefill rates without it.
    rtt_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class PeerSpec:
    """Another balancer this one may forward to, and how far away it is."""

    name: str
    url: str
    region: str
    rtt_ms: float = math.inf


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One served model's routing configuration (from ServiceConfig).

    ``policy_params`` holds the policy's own parameters only: the selective
    pushing keys (``"pushing"``, ``"push_budget"``) are split off into
    ``pushing`` by ``core.availability.split_pushing_params``.
    """

    name: str
    policy: str = "least_load"
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    pushing: PushingConfig = field(default_factory=PushingConfig)
    # The regional queue's bounds (SkyLB §3.3): beyond them 429 / 503.
    queue_max_len: int = 1024
    queue_max_wait_s: float = 30.0


@dataclass(frozen=True, slots=True)
class TopologySnapshot:
    balancer: str
    region: str
    url: str
    replicas: tuple[ReplicaSpec, ...] = ()
    peers: tuple[PeerSpec, ...] = ()
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    # Configured models with a ready replica somewhere (servable here or by a peer).
    served_models: frozenset[str] = frozenset()
    api_key_hashes: frozenset[str] = frozenset()
    # Per-key limits and usage labels by key hash (keys without limits have an entry too).
    key_limits: Mapping[str, KeyLimits] = field(default_factory=dict)
    key_labels: Mapping[str, str] = field(default_factory=dict)
    loaded_at: float = 0.0  # wall clock before its first read: rows committed by then are in it
    # The database's topology token read with it (fleet.topology_change); None: unknown,
    # so the next refresh reads in full.
    change_token: int | None = None

    def peer(self, name: str) -> PeerSpec | None:
        return next((p for p in self.peers if p.name == name), None)
