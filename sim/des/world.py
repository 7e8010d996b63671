"""Build a simulated deployment from a ``SimConfig`` and run it to the end.

``simulate(config)`` wires regions, replicas (``SimReplica`` around the real
``Engine``), balancers (``SimBalancer`` driving the real dispatch core) and clients,
gives every balancer its topology the way ``routing.topology`` would (its own
replicas; every other balancer as a peer with the region RTT), subscribes a
``cache_map`` balancer to its replicas' KV events, runs the event
loop until the clients' budget is spent and everything in flight has finished
(or ``drain_s`` more virtual seconds passed), and returns the raw records for
``sim.des.metrics``.  Everything is seeded: the same config gives the same
result, event for event.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.availability import PUSHING_KEY, split_pushing_params
from core.blocks import DEFAULT_SEED
from core.load_forecast import LoadForecast
from core.predictors import build_predictor
from core.registry import policy_defaults
from core.tokenizer import build_tokenizer
from core.topology import ModelSpec, PeerSpec, ReplicaSpec
from sim.des.balancer import SimBalancer
from sim.des.clients import Budget, ClientContext, RegionClients, RequestRecord
from sim.des.config import MODEL, SimConfig, SimConfigError
from sim.des.loop import EventLoop
from sim.des.replica import SimReplica
from sim.des.workloads import region_arrivals
from sim.engine import Engine, EngineConfig, Vocabulary
from sim.engine.profiles import get_profile
from sim.engine.stats import TokenWaits

SliceHook = Callable[[float, int], None]


@dataclass
class RunStats:
    """How the simulation itself ran (for ``bench sim``)."""

    wall_s: float = 0.0
    events: int = 0
    engine_steps: int = 0
    probes: int = 0
    peak_bytes: int | None = None


@dataclass
class SimRun:
    """Everything a run produced; ``sim.des.metrics.summarize`` reads it."""

    config: SimConfig
    records: list[RequestRecord]
    end_s: float
    # (time, outstanding per replica) every ``sample_interval_s``.
    samples: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    replica_names: tuple[str, ...] = ()
    stats: RunStats = field(default_factory=RunStats)
    # What the fleet's sampled tokens waited for, by the step model's terms.
    waits: TokenWaits = field(default_factory=TokenWaits)
    # (time, each replica's running batch) at the same instants as ``samples``.
    batches: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    # Each replica's region, in ``replica_names``' order.
    replica_regions: tuple[str, ...] = ()


class World:
    """The simulated deployment: the ``Network`` the balancers look things up in."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.loop = EventLoop()
        self.tokenizer = build_tokenizer(None)
        self.vocab = Vocabulary(self.tokenizer)
        self.replicas: dict[str, SimReplica] = {}
        self.balancers: dict[str, SimBalancer] = {}
        self.entry: dict[str, SimBalancer] = {}
        self._build_replicas()
        self._build_balancers()

    # Network
    def one_way_s(self, a: str, b: str) -> float:
        return self.config.one_way_s(a, b)

    def replica(self, name: str) -> SimReplica:
        return self.replicas[name]

    def balancer(self, name: str) -> SimBalancer:
        return self.balancers[name]

    def _build_replicas(self) -> None:
        cfg = self.config
        for region, count in cfg.replicas.items():
            for index in range(1, count + 1):
                name = f"{region}-r{index}"
                engine = Engine(cfg.engine, self.vocab)
                self.replicas[name] = SimReplica(
                    name, region, engine, self.loop, time_scale=cfg.time_scale
                )

    def model_spec(self) -> ModelSpec:
        """The service as ``routing.topology`` builds it from a ServiceConfig row: the
        pushing keys (mode from ``pushing``, ``push_budget``) split off the policy's."""
        cfg = self.config
        given = {
            **engine_defaults(cfg.policy, cfg.engine),
            **slo_defaults(cfg.policy, cfg.ttft_slo_s),
            **cfg.policy_params,
        }
        try:
            pushing, params = split_pushing_params({**given, PUSHING_KEY: cfg.effective_pushing})
        except ValueError as exc:
            raise SimConfigError(str(exc)) from None
        return ModelSpec(
            name=MODEL,
            policy=cfg.policy,
            policy_params=params,
            pushing=pushing,
            queue_max_len=cfg.timing.queue_max_len,
            queue_max_wait_s=cfg.timing.queue_max_wait_s,
        )

    def _build_balancers(self) -> None:
        cfg = self.config
        deployment = cfg.effective_deployment
        homes = [cfg.home_region] if deployment == "single" else cfg.regions
        for region in homes:
            forecast = LoadForecast(build_predictor(cfg.length_predictor))
            self.balancers[f"{region}-lb"] = SimBalancer(
                f"{region}-lb", region, self, cfg.timing, forecast
            )
        models = {MODEL: self.model_spec()}
        for lb in self.balancers.values():
            owned = [
                ReplicaSpec(
                    r.name,
                    f"sim://{r.name}",
                    MODEL,
                    r.region,
                    f"{r.region}-1",
                    "reserved",
                    cfg.rtt_ms_between(lb.region, r.region),
                )
                for r in self.replicas.values()
                if deployment == "single" or r.region == lb.region
            ]
            peers = [
                PeerSpec(
                    other.name,
                    f"sim://{other.name}",
                    other.region,
                    cfg.rtt_ms_between(lb.region, other.region),
                )
                for other in self.balancers.values()
                if other is not lb and deployment == "regional"
            ]
            lb.adopt(owned, peers, models)
            if lb.router.kv_sink(MODEL) is not None:
                for spec in owned:
                    self.replicas[spec.name].subscribe_kv_events(
                        functools.partial(lb.kv_events_arrive, spec.name, MODEL)
                    )
        for region in cfg.regions:
            self.entry[region] = (
                self.balancers.get(f"{region}-lb") or self.balancers[f"{homes[0]}-lb"]
            )

    def _sample(
        self,
        samples: list[tuple[float, tuple[int, ...]]],
        batches: list[tuple[float, tuple[int, ...]]],
    ) -> None:
        now, replicas = self.loop.now, self.replicas.values()
        samples.append((now, tuple(r.outstanding for r in replicas)))
        batches.append((now, tuple(r.engine.num_running for r in replicas)))
        self.loop.call_later(self.config.sample_interval_s, self._sample, samples, batches)

    def run(self, *, trace_memory: bool = False, on_slice: SliceHook | None = None) -> SimRun:
        cfg = self.config
        if trace_memory:
            tracemalloc.start()
        started = time.perf_counter()
        budget = Budget(cfg.duration_s, cfg.max_requests, start_s=cfg.warmup_s)
        records: list[RequestRecord] = []
        # Clients key blocks as a balancer in token_ids mode would: with Meridian's
        # own chain, whatever hash the emulated engines use inside.
        oracle = true_output(cfg.engine) if cfg.length_predictor == "oracle" else None
        ctx = ClientContext(
            self.loop, self.tokenizer, self.vocab, DEFAULT_SEED, budget, records, oracle
        )
        for lb in self.balancers.values():
            lb.start()
        self.loop.run(until=cfg.warmup_s)
        regions = []
        for index, region in enumerate(cfg.regions):
            entry = self.entry[region]
            one_way = cfg.one_way_s(region, entry.region)
            clients = RegionClients(region, ctx, entry.submit, one_way)
            region_arrivals(cfg, index).start(clients)
            regions.append(clients)
        samples: list[tuple[float, tuple[int, ...]]] = []
        batches: list[tuple[float, tuple[int, ...]]] = []
        self.loop.call_soon(self._sample, samples, batches)
        end = self._run_until_done(budget, regions, on_slice)
        stats = RunStats(
            wall_s=time.perf_counter() - started,
            events=self.loop.events_run,
            engine_steps=sum(r.steps for r in self.replicas.values()),
            probes=sum(lb.probes for lb in self.balancers.values()),
        )
        if trace_memory:
            stats.peak_bytes = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        names = tuple(self.replicas)
        finished = [r.done_at for r in records if r.done_at is not None]
        waits = TokenWaits()
        for replica in self.replicas.values():
            waits.merge(replica.engine.stats.waits)
        return SimRun(
            cfg,
            records,
            max(finished, default=end),
            samples,
            names,
            stats,
            waits=waits,
            batches=batches,
            replica_regions=tuple(r.region for r in self.replicas.values()),
        )

    def _run_until_done(
        self, budget: Budget, regions: list[RegionClients], on_slice: SliceHook | None
    ) -> float:
        """Run in slices until every client is idle, or ``drain_s`` after the budget."""
        cfg = self.config
        slice_s = 1.0
        deadline: float | None = None
        while True:
            self.loop.run(until=self.loop.now + slice_s)
            if on_slice is not None:
                on_slice(self.loop.now - budget.start_s, budget.sent)
            if all(c.idle() for c in regions):
                break
            if budget.spent(self.loop.now) and deadline is None:
                deadline = self.loop.now + cfg.drain_s
            if deadline is not None and self.loop.now >= deadline:
                break
        return self.loop.now


def simulate(
    config: SimConfig, *, trace_memory: bool = False, on_slice: SliceHook | None = None
) -> SimRun:
    """Run one simulation; deterministic for ``config`` (its ``seed`` included).

    ``on_slice(virtual_s, sent)`` hears, every virtual second, how far the clients
    are into their budget (seconds since the warm-up, requests sent): a progress bar."""
    return World(config).run(trace_memory=trace_memory, on_slice=on_slice)


def with_policy(config: SimConfig, policy: str) -> SimConfig:
    return dataclasses.replace(config, policy=policy)


def true_output(engine: EngineConfig) -> Callable[[list[int], int, bool], int]:
    """The output length the emulated engine will produce, as ``Engine.add_request``
    decides it (the DES sends no per-request seed): the oracle predictor's truth."""
    lengths = engine.output_lengths

    def truth(prompt_ids: list[int], max_tokens: int, ignore_eos: bool) -> int:
        if ignore_eos:
            return max_tokens
        return min(lengths.sample(lengths.rng_for(prompt_ids, None, engine.seed)), max_tokens)

    return truth


# A decode step's batch when pricing inter-token latency before any is measured.
TYPICAL_DECODE_BATCH = 16
# Context one running sequence attends to, for the marginal step time of one more.
TYPICAL_CONTEXT_TOKENS = 1024


def slo_defaults(policy: str, ttft_slo_s: float) -> dict[str, Any]:
    """The SLO the run's goodput counts, for a policy that prices missing it (its
    config has ``ttft_slo_s``): the production balancer is given its service's
    SLO as ``policy_params``, and a run scored on another SLO than the policy's
    default would otherwise route for one and be judged on the other."""
    return {"ttft_slo_s": ttft_slo_s} if "ttft_slo_s" in policy_defaults(policy) else {}


def engine_defaults(policy: str, engine: EngineConfig) -> dict[str, Any]:
    """What a policy that prices engine time should assume before it learns.

    The production balancer is given these as ``policy_params`` for its engines'
    card; here the simulated engines' profile and shape say them: prefill and
    step rates, one decode step of a typical batch, the KV capacity (which also
    bounds the per-replica prefix tree), the order the engines serve their queues
    in (``--schedule-policy``); the admission limit follows from the prefill rate
    (``MeridianConfig.admission_limit``).  Only a policy that prices engine time (its
    config has ``prefill_s_per_token``) is given them, so the baselines'
    settings (SGLang's tree bound) stay their own; a profile with no GPU time
    (``zero``) keeps the policy's own defaults.
    """
    shape = get_profile(engine.profile)
    known = policy_defaults(policy)
    if shape.prefill_s_per_token <= 0 or "prefill_s_per_token" not in known:
        return {}
    values: dict[str, Any] = {
        "prefill_s_per_token": shape.prefill_s_per_token,
        "step_s": shape.fixed_s,
        "itl_s": shape.fixed_s + shape.decode_s_per_seq * TYPICAL_DECODE_BATCH,
        "seq_s": shape.decode_s_per_seq + shape.kv_read_s_per_token * TYPICAL_CONTEXT_TOKENS,
        "kv_capacity_tokens": engine.num_blocks * engine.block_size,
        "max_blocks_per_target": engine.num_blocks,
        "engine_queue": engine.schedule_policy.value,
        "max_num_seqs": engine.max_num_seqs,
    }
    return {key: value for key, value in values.items() if key in known}
