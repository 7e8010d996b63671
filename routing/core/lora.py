"""LoRA adapters: which base model serves a request, and which replicas to prefer for it.

vLLM serves an adapter under its own model name (``--lora-modules name=path``)
on the base model's replicas, so a request whose ``model`` is an adapter name
is routed among the base model's replicas (``resolve_model``; the adapter-to-base
map is configuration, ``MERIDIAN_LORA_ADAPTERS``) and keeps its adapter name in
the body the engine receives.  The adapter is also part of every block's key,
as in vLLM, because an adapter's KV differs from the base model's.

Affinity follows the Gateway API inference extension's LoRA filter, from each
replica's latest ``vllm:lora_requests_info`` (``routing.core.engine_metrics``):

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

from routing.core.types import TargetState

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
