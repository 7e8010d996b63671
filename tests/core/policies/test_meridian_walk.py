"""Meridian's indexed walk over cold replicas against pricing every candidate.

The walk stops early on bounds filed in ``core.cost_floors``; whatever the
ledgers, learned rates and probed KV usage, it must find what pricing every
candidate with ``replica_cost`` finds, to the last bit.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.policies.meridian import MeridianConfig, MeridianPolicy
from core.policy import Option
from core.types import RequestDescriptor, TargetState
from tests.support.descriptors import prefix, target

DOCS = [prefix(d, 6) for d in range(3)]


def draw_request(data: st.DataObject, tag: int, max_blocks: int) -> RequestDescriptor:
    """A prompt that extends one of a few shared documents, or stands alone."""
    doc = data.draw(st.sampled_from([(), *DOCS]))
    own = data.draw(st.integers(1, max_blocks))
    blocks = prefix(tag, own, doc)
    rid = f"req-{tag}"
    output = data.draw(st.none() | st.integers(0, 700))
    return RequestDescriptor(rid, "m", 16 * len(blocks), blocks, predicted_output_tokens=output)


def draw_candidates(data: st.DataObject, fleet: list[TargetState]) -> list[TargetState]:
    return data.draw(st.lists(st.sampled_from(fleet), min_size=1, unique_by=lambda t: t.target_id))


def drive(data: st.DataObject, policy: MeridianPolicy, fleet: list[TargetState]) -> None:
    """Random traffic: decisions, first tokens, finishes, completions and probes."""
    sent: list[tuple[RequestDescriptor, TargetState]] = []
    for n in range(data.draw(st.integers(0, 30))):
        step = data.draw(st.sampled_from(["select", "first", "finish", "complete", "probe"]))
        if step == "select":
            r = draw_request(data, 100 + n, 300)
            chosen = policy.select(r, draw_candidates(data, fleet))
            if chosen is not None:
                sent.append((r, chosen))
        elif step == "probe":
            usage = data.draw(st.floats(0.0, 1.0))
            policy.observe_probe(data.draw(st.sampled_from(fleet)).target_id, usage)
        elif sent:
            r, t = data.draw(st.sampled_from(sent))
            if step == "first":
                policy.observe_first_token(r, t.target_id, data.draw(st.floats(0.0, 6.0)))
            elif step == "finish":
                decode_s = data.draw(st.floats(0.0, 30.0))
                policy.observe_finish(r, t.target_id, decode_s, data.draw(st.integers(0, 900)))
            else:
                policy.on_complete(r, t, ok=True)
                sent.remove((r, t))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.data())
def test_the_indexed_walk_decides_as_pricing_every_candidate(data: st.DataObject) -> None:
    # Capacities below and above the prompts drawn: both of the walk's orders run.
    capacity = data.draw(st.sampled_from([300, 1024, 4096]))
    config = MeridianConfig(kv_capacity_tokens=capacity, affinity_tokens=10**6)
    policy = MeridianPolicy(config)
    fleet = [target(f"r{i:02d}") for i in range(data.draw(st.integers(1, 12)))]
    policy.on_targets_changed([t.target_id for t in fleet])
    drive(data, policy, fleet)
    probe = draw_request(data, 99, 400)
    candidates = draw_candidates(data, fleet)
    uncached = policy.uncached_by_target(probe, {t.target_id for t in candidates})

    def price(t: TargetState, extra_tokens: float = 0.0) -> float:
        tokens = uncached.get(t.target_id, probe.prompt_tokens)
        rate = policy.replicas[t.target_id].prefill_s_per_token
        return policy.replica_cost(probe, t, tokens) + extra_tokens * rate

    # As a wait, with requests queued ahead: the least price plus their prefill there.
    queued_ahead = data.draw(st.integers(0, 4))
    ahead = queued_ahead * policy.mean_uncached / len(candidates)
    costs = {t.target_id: price(t, ahead) for t in candidates}
    wait = policy.choose(probe, [], candidates, [], queued_ahead=queued_ahead)
    assert wait.option is Option.WAIT and wait.cost_s == min(costs.values())
    # As a replica: the cheapest candidate, chosen at exactly its own price.
    costs = {t.target_id: price(t) for t in candidates}
    choice = policy.choose(probe, candidates, [], [])
    assert choice.target is not None and choice.cost_s == min(costs.values())
    assert costs[choice.target.target_id] == choice.cost_s
