"""LoRA adapters: which base model serves a request, and which replicas to prefer for it.

vLLM serves an adapter under its own model name (``--lora-modules name=path``)
on the base model's replicas, so a request whose ``model`` is an adapter name
is routed among the base model's replicas (``resolve_model``) and keeps its
adapter name in the body the engine receives.  The adapter-to-base map is learned
from the engines: vLLM's ``GET /v1/models`` lists each adapter as a card whose
``parent`` is the base model (``adapters_in_models``), which the balancer's probe
reads into an ``AdapterDirectory``; ``MERIDIAN_LORA_ADAPTERS`` is optional and,
where it names an adapter, wins over what the engines say.  The adapter is also
part of every block's key, as in vLLM, because an adapter's KV differs from the
base model's.

Affinity follows the Gateway API inference extension's LoRA filter, from each
replica's latest ``vllm:lora_requests_info`` (``core.engine_metrics``):

1. replicas where the adapter is *active* (in use by running or waiting
   requests: in GPU memory, or about to be) serve it with no adapter load;
2. else replicas with *room* (fewer active adapters than ``max_lora``) load it
   without evicting one that other requests are using;
3. else any replica (it will swap an adapter in).

Replicas that export no LoRA information (never probed, or an engine without
the metric) count as having room: nothing says an adapter must be evicted there.
The tiers only narrow the candidates; the model's policy still picks among them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from core.types import TargetState

ACTIVE, ROOM, EVICTS = 0, 1, 2


class UnknownModelError(LookupError):
    """The request names neither a configured model nor an adapter of one."""


def resolve_model(
    requested: str, models: Collection[str], adapters: Mapping[str, str]
) -> tuple[str, str | None]:
    """(the model whose replicas serve ``requested``, its adapter or None)."""
    if requested in models:
        return requested, None
    base = adapters.get(requested)
    if base is not None and base in models:
        return base, requested
    raise UnknownModelError(requested)


def adapters_in_models(payload: Any) -> dict[str, str]:
    """Adapter -> base model from a ``/v1/models`` answer (cards with a ``parent``).

    vLLM lists the base model with ``parent: null`` and each LoRA adapter with
    ``parent`` set to the base model's id; anything unexpected is skipped."""
    data = payload.get("data") if isinstance(payload, Mapping) else None
    found: dict[str, str] = {}
    for card in data if isinstance(data, list) else ():
        if not isinstance(card, Mapping):
            continue
        name, parent = card.get("id"), card.get("parent")
        if isinstance(name, str) and isinstance(parent, str) and name and name != parent:
            found[name] = parent
    return found


class AdapterDirectory:
    """Which adapters the replicas serve, learned per replica, with configuration on top."""

    def __init__(self, configured: Mapping[str, str] | None = None) -> None:
        self.configured = dict(configured or {})
        self._by_replica: dict[str, dict[str, str]] = {}
        self._merged = dict(self.configured)

    def record(self, replica: str, adapters: Mapping[str, str]) -> None:
        """What ``replica``'s ``/v1/models`` lists now (replacing what it listed before)."""
        if self._by_replica.get(replica) != adapters:
            self._by_replica[replica] = dict(adapters)
            self._merge()

    def keep_only(self, replicas: Collection[str]) -> None:
        """Forget replicas this balancer no longer routes to."""
        gone = set(self._by_replica) - set(replicas)
        for replica in gone:
            del self._by_replica[replica]
        if gone:
            self._merge()

    def adapters(self) -> Mapping[str, str]:
        """Adapter -> base model: learned from every replica, configuration winning."""
        return self._merged

    def learned(self) -> dict[str, str]:
        return {
            a: b
            for replica in sorted(self._by_replica)
            for a, b in self._by_replica[replica].items()
        }

    def _merge(self) -> None:
        self._merged = {**self.learned(), **self.configured}


def adapter_tier(target: TargetState, adapter: str) -> int:
    """How cheaply ``target`` serves ``adapter``: ``ACTIVE`` < ``ROOM`` < ``EVICTS``."""
    info = target.lora
    if info is None:
        return ROOM
    if adapter in info.active:
        return ACTIVE
    return ROOM if info.has_room else EVICTS


def lora_affinity(candidates: Sequence[TargetState], adapter: str | None) -> list[TargetState]:
    """The candidates in the best affinity tier for ``adapter`` (all of them without one)."""
    if not adapter or not candidates:
        return list(candidates)
    tiers = [adapter_tier(t, adapter) for t in candidates]
    best = min(tiers)
    return [t for t, tier in zip(candidates, tiers, strict=True) if tier == best]
