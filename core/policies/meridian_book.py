"""The replicas Meridian's cost model knows, filed by the floors of their cost.

``ReplicaBook`` keeps one ``ReplicaModel`` per replica (its learned rates, the
ledger of what this balancer sent it, its probed KV usage) and files each in a
``CostFloors`` index whenever one of those changes, so that ``cheapest`` can price
the replicas holding part of a prompt one by one and walk the cold ones from
the index, stopping once no replica left could be cheaper.  The policy
(``core.policies.meridian``) decides; this is its bookkeeping and its
walk, with no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from core.cost_floors import CostFloors
from core.policies.meridian_terms import (
    MeridianConfig,
    ReplicaModel,
    drain_s,
    replica_cost,
    rtt_s,
    slot_wait_s,
)
from core.policy import load_key
from core.types import RTT_KEY, TargetState


class ReplicaBook:
    """Every replica's model, indexed by the floors of its cost."""

    def __init__(self, config: MeridianConfig) -> None:
        self.config = config
        self.replicas: dict[str, ReplicaModel] = {}
        # Replicas by the floors of their cost (core.cost_floors), kept sorted
        # as ledgers and probes change, and the least prefill rate: together a lower
        # bound on any cold replica's cost.
        self.floors = CostFloors()
        self.least_rate = config.prefill_s_per_token

    def model(self, target_id: str) -> ReplicaModel:
        """The replica's model; a replica never seen starts idle on the default rates."""
        model = self.replicas.get(target_id)
        if model is None:
            cfg = self.config
            model = ReplicaModel(
                cfg.prefill_s_per_token,
                cfg.itl_s,
                float(cfg.default_output_tokens),
                cfg.local_rtt_s,
            )
            self.replicas[target_id] = model
            self.least_rate = min(self.least_rate, model.prefill_s_per_token)
            self.reindex(target_id, model)
        return model

    def retain(self, keep: set[str]) -> None:
        """Forget every replica not in ``keep``."""
        self.replicas = {k: v for k, v in self.replicas.items() if k in keep}
        self.floors.retain(keep)
        self.relearn_least_rate()

    def relearn_least_rate(self) -> None:
        """Recompute the least prefill rate (a full scan: off the decision path)."""
        rates = (m.prefill_s_per_token for m in self.replicas.values())
        self.least_rate = min(rates, default=self.config.prefill_s_per_token)

    def sync_rtt(self, target_id: str, model: ReplicaModel, rtt: float) -> None:
        """Keep the round trip the index and the learning use as the target says."""
        if model.rtt_s != rtt:
            model.rtt_s = rtt
            self.reindex(target_id, model)

    def reindex(self, target_id: str, model: ReplicaModel) -> None:
        """File ``target_id``'s cost floor (``core.cost_floors``): its queued
        prefill, the wait for one of its batch slots (``slot_wait_s``), its ledger's
        KV pressure and its round trip beyond the local one (as
        last seen: ``sync_rtt``); its overflow keys go stale until a request larger
        than the capacity needs them."""
        cfg = self.config
        queued_s = model.queued_prefill * model.prefill_s_per_token + slot_wait_s(cfg, model)
        over = model.kv_tokens - cfg.kv_capacity_tokens
        floor = queued_s + (drain_s(over, model.kv_tokens, model) if over > 0 else 0.0)
        self.floors.file_floor(target_id, floor + (model.rtt_s - cfg.local_rtt_s))

    def cheapest(
        self,
        prompt: int,
        decode: int,
        by_id: dict[str, TargetState],
        uncached: Mapping[str, int],
        extra_tokens: float,
    ) -> tuple[TargetState | None, float]:
        """The target of least ``replica_cost + extra_tokens * p`` for a prompt of
        ``prompt`` tokens with ``decode`` look-ahead decode tokens, and that cost.

        Prefix holders are priced one by one.  Cold targets (``U = prompt``) are
        walked from ``self.floors`` (``core.cost_floors``), whose keys plus
        ``(prompt + extra_tokens) * least rate + step + local_rtt_s`` (the least round
        trip) bound the cost of every target not yet priced (harm is never negative).
        Every key includes the target's round trip beyond ``local_rtt_s`` as last seen
        (the walk prices the target's own and re-files a target whose round trip
        changed, after the walk).  When the request's own KV (``prompt + look-ahead
        decode``) fits in the capacity, the walk takes the targets by their floor
        (``Q * p`` plus the pressure of the ledger alone); when it does not, every
        target overflows and its pressure is exactly ``alpha + slope * (KV -
        capacity)``, so the walk takes the ``base`` and ``slope`` orders in turn and
        bounds the rest by both cursors.  It stops once the bound is no cheaper than
        the best found: a decision prices the holders and the few cold targets that
        could win, not every candidate.  Holders tie-break by ``load_key``; cold
        targets by the walk's order (by key, then id: between replicas in the same
        state, the lower id).
        """
        if not by_id:
            return None, math.inf
        best: TargetState | None = None
        best_cost = math.inf
        holders = 0
        for target_id, tokens in uncached.items():
            target = by_id.get(target_id)
            if target is None:
                continue
            holders += 1
            model = self.model(target_id)
            self.sync_rtt(target_id, model, rtt_s(self.config, target))
            rate = model.prefill_s_per_token
            cost = replica_cost(self.config, model, tokens, decode)
            cost += extra_tokens * rate
            if best is None or (cost, load_key(target)) < (best_cost, load_key(best)):
                best, best_cost = target, cost
        if holders == len(by_id):
            return best, best_cost  # no cold target among them: nothing to walk
        floors = self.floors
        if not floors.ids() >= by_id.keys():
            for target_id in by_id.keys() - floors.ids():
                self.model(target_id)  # a target never seen: index it (idle, default rates)
        cfg = self.config
        capacity = cfg.kv_capacity_tokens
        added = prompt + decode
        over = added - capacity
        order: Iterable[tuple[float, str]] = floors.by_floor
        if over >= 0:
            if floors.stale:
                self._refile_stale()
            order = floors.overflow_order(over)
        local_rtt_s, step_s = cfg.local_rtt_s, cfg.step_s
        floor = local_rtt_s + step_s + (prompt + extra_tokens) * self.least_rate
        # ``replica_cost`` and ``pressure_s`` inlined, the same arithmetic in the same order:
        # the calls were most of a walk's price per replica.
        # Harm is priced at the engine's compute rate (``harm_s``), the same for every target.
        harm_per_decoder = cfg.harm_weight * prompt * cfg.prefill_s_per_token
        max_num_seqs = cfg.max_num_seqs
        replicas = self.replicas
        get = by_id.get
        moved: list[tuple[str, ReplicaModel, float]] = []
        for least_s, target_id in order:
            if least_s + floor >= best_cost:
                break
            target = get(target_id)
            if target is None or target_id in uncached:
                continue
            model = replicas[target_id]
            rate = model.prefill_s_per_token
            prefill_s = prompt * rate
            rtt = target.extra.get(RTT_KEY, 0.0) / 1000.0
            if rtt < local_rtt_s:
                rtt = local_rtt_s
            if rtt != model.rtt_s:  # the index is walked: re-placed after the walk
                moved.append((target_id, model, rtt))
            cost = rtt + step_s + model.queued_prefill * rate + prefill_s
            excess = len(model.inflight) + 1 - max_num_seqs
            if excess > 0:
                cost += excess * model.mean_output * model.itl_s / max_num_seqs
            cost += harm_per_decoder * model.decoding
            held = int(model.kv_usage * capacity)
            if model.kv_tokens > held:
                held = model.kv_tokens
            overflow = held + added - capacity
            if overflow > 0:
                cost += overflow * model.mean_output * model.itl_s / (held if held > 1 else 1)
            cost += extra_tokens * rate
            if cost < best_cost:
                best, best_cost = target, cost
        for target_id, model, rtt in moved:
            self.sync_rtt(target_id, model, rtt)
        return best, best_cost

    def _refile_stale(self) -> None:
        """File the overflow keys of every replica whose state moved since."""
        floors, cfg = self.floors, self.config
        capacity = cfg.kv_capacity_tokens
        for target_id in tuple(floors.stale):
            model = self.replicas[target_id]
            held = max(int(model.kv_usage * capacity), model.kv_tokens)
            lifetime = model.mean_output * model.itl_s
            base = model.queued_prefill * model.prefill_s_per_token + slot_wait_s(cfg, model)
            base += lifetime if held >= 1 else 0.0
            base += model.rtt_s - cfg.local_rtt_s
            floors.file_overflow(target_id, base, lifetime / max(1, held))
