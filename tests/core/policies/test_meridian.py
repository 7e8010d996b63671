"""Meridian's cost model: each term on its own, then replica vs waiting vs peer.

Costs are in seconds under the default L4 profile rates (0.53 ms per uncached
prompt token, 30 ms per step); requests are 16 tokens per block hash.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from core.availability import PushingMode
from core.policies.meridian import MeridianConfig, MeridianPolicy
from core.policies.meridian_terms import COLD_COPY_PRIORITY, DEFAULT_PRIORITY
from core.policy import CostModel, Option
from core.prefix_digest import PrefixDigest, digest_of
from core.radix_tree import RadixTree
from core.registry import build_policy, default_pushing
from core.types import RequestDescriptor, TargetState
from tests.support.descriptors import prefix, request, target

RATE = MeridianConfig().prefill_s_per_token
# The terms of the time to first token on their own, without the decode terms.
NO_DECODE = MeridianConfig(decode_weight=0.0)


def peer(name: str, rtt_ms: float, estimate_s: float = 0.0) -> TargetState:
    return target(name, extra={"rtt_ms": rtt_ms, "estimate_s": estimate_s})


def on_profile(tokens: int) -> float:
    """The TTFT the default rates predict for an idle replica: no rate change."""
    config = MeridianConfig()
    return config.local_rtt_s + config.step_s + tokens * RATE


def sized(tokens: int, rid: str, output: int | None = None) -> RequestDescriptor:
    return RequestDescriptor(rid, "m", tokens, predicted_output_tokens=output)


def held_back_holding(
    policy: MeridianPolicy, home: TargetState, held: tuple[int, ...] = ()
) -> None:
    """``home`` caches ``held`` and has 8,000 prompt tokens of prefill queued: past any
    admission limit here, so it is reached only by waiting."""
    if held:
        policy.select(request(held), [home])
    policy.select(sized(8000, "backlog"), [home])


def test_it_is_the_registry_default_and_admits_by_tokens() -> None:
    policy = build_policy("meridian")
    assert isinstance(policy, CostModel)
    assert default_pushing("meridian") is PushingMode.TOKENS
    assert default_pushing("sglang") is PushingMode.SP_P


def test_the_admission_limit_is_what_the_engine_prefills_in_the_wait_limit() -> None:
    # 0.25 s at 0.53 ms per token (an L4): 472 tokens; an H100's 0.04 ms: 6,250.
    assert MeridianConfig().admission_limit() == 472
    h100 = MeridianConfig(prefill_s_per_token=0.04e-3)
    assert h100.admission_limit() == 6250
    assert MeridianConfig(wait_limit_s=1.0).admission_limit() == 1887
    # Set, it is taken as given; with no wait at all an idle engine still admits.
    assert MeridianConfig(admission_tokens=4096).admission_limit() == 4096
    assert MeridianConfig(wait_limit_s=0.0).admission_limit() == 1
    policy, a = MeridianPolicy(h100), target("a")
    policy.select(sized(6249, "under"), [a])
    assert policy.admits(a)
    policy.select(sized(1, "at"), [a])
    assert not policy.admits(a)


def test_a_first_token_says_whether_it_reopened_its_replica() -> None:
    policy, a = MeridianPolicy(MeridianConfig(admission_tokens=1000)), target("a")
    small, big = sized(300, "small"), sized(1200, "big")
    policy.select(small, [a])
    policy.select(big, [a])  # 1,500 queued: held back
    assert not policy.admits(a)
    assert policy.observe_first_token(small, "a", 0.2) is False  # 1,200 queued: still held
    assert policy.observe_first_token(big, "a", 0.6) is True  # nothing queued: it admits
    assert policy.observe_first_token(big, "a", 0.7) is False  # counted once
    assert policy.observe_first_token(sized(10, "unknown"), "a", 0.1) is False


def test_the_replica_holding_the_prefix_is_cheaper_by_the_tokens_it_saves() -> None:
    policy = MeridianPolicy(NO_DECODE)
    a, b = target("a"), target("b")
    doc = prefix(1, 40)
    first = request(doc)
    policy.select(first, [a])
    follow_up = request(prefix(2, 4, doc))
    assert policy.uncached_by_target(follow_up, {"a", "b"}) == {"a": 4 * 16}
    # a still prefills the first 640 tokens: that queued work eats the whole saving.
    assert policy.replica_cost(follow_up, a, 64) == pytest.approx(
        policy.replica_cost(follow_up, b, 44 * 16)
    )
    # Once the first request's first token is back, a is cheaper by the 640 tokens.
    policy.observe_first_token(first, "a", on_profile(640))
    saving = policy.replica_cost(follow_up, b, 44 * 16) - policy.replica_cost(follow_up, a, 64)
    assert saving == pytest.approx(640 * RATE - policy.config.harm_weight * 64 * RATE)
    assert policy.select(follow_up, [a, b]) is a


def test_queued_prefill_outweighs_a_small_saving() -> None:
    policy = MeridianPolicy()
    holder, idle = target("holder"), target("idle")
    doc = prefix(1, 4)
    policy.select(request(doc), [holder])
    policy.select(sized(3000, "big"), [holder])  # 3,000 tokens queued on the holder
    assert policy.replicas["holder"].queued_prefill == 64 + 3000
    # Saving 64 tokens is not worth waiting behind 3,064.
    assert policy.select(request(prefix(2, 2, doc)), [holder, idle]) is idle


def test_harm_sends_a_cold_prompt_where_fewer_requests_decode() -> None:
    policy = MeridianPolicy(MeridianConfig(harm_weight=1.0, decode_weight=0.0))
    busy, quiet = target("busy"), target("quiet")
    for i in range(3):
        policy.select(sized(16, f"d{i}"), [busy])
        policy.observe_first_token(sized(16, f"d{i}"), "busy", 0.05)
    assert policy.replicas["busy"].decoding == 3
    cold = sized(1000, "cold")
    harm = 1000 * RATE * 3
    assert policy.replica_cost(cold, busy, 1000) - policy.replica_cost(cold, quiet, 1000) == (
        pytest.approx(harm)
    )
    assert policy.select(cold, [busy, quiet]) is quiet


def test_harm_is_priced_at_the_engines_compute_rate_not_the_learned_one() -> None:
    policy = MeridianPolicy(MeridianConfig(ewma_alpha=1.0, decode_weight=0.0))
    busy = target("busy")
    for i in range(3):
        running = sized(1000, f"d{i}")
        policy.select(running, [busy])
        # Each first token took four times the profile's rate: the decode work that
        # shared its steps and the queue ahead, learned into the replica's rate.
        queued = policy.replicas["busy"].queued_prefill
        policy.observe_first_token(running, "busy", on_profile(4 * queued))
    learned = policy.replicas["busy"].prefill_s_per_token
    assert learned == pytest.approx(4 * RATE)
    assert policy.replicas["busy"].decoding == 3
    cold = sized(1000, "cold")
    # Its own wait is the learned rate; the stall of each of the three decoders is
    # what the engine computes in a step, the profile's rate.
    extra = policy.replica_cost(cold, busy, 1000) - policy.replica_cost(cold, busy, 0)
    assert extra == pytest.approx(1000 * learned + 1000 * RATE * 3)


def test_a_replica_with_every_batch_slot_taken_prices_the_wait_for_one() -> None:
    config = MeridianConfig(max_num_seqs=2, decode_weight=0.0)
    policy = MeridianPolicy(config)
    full, free = target("full"), target("free")
    doc = prefix(1, 40)  # 640 tokens, all of it cached on ``full``
    running = [request(prefix(10 + i, 1, doc)) for i in range(2)]
    for r in running:
        policy.select(r, [full])
        entry = policy.replicas["full"].inflight[r.request_id]
        # First tokens at the profile's rate: nothing learned moves the prices below.
        policy.observe_first_token(r, "full", on_profile(entry.queued_ahead + entry.uncached))
    model = policy.replicas["full"]
    # Two sequences run on an engine that runs two: a third starts when one of them
    # ends, and the two end over one request lifetime.
    slot_s = model.mean_output * model.itl_s / 2
    turn = request(prefix(99, 1, doc))
    one_more = policy.replica_cost(turn, full, 16)
    assert one_more == pytest.approx(on_profile(16) + 16 * RATE * 2 + slot_s)
    # A 4.5 s wait for a slot outweighs copying 640 cached tokens to an idle replica:
    # the turn waits for a holder's slot only as long as prefix affinity holds.
    assert policy.choose(turn, [full, free], [], []).option is Option.WAIT
    waited = policy.choose(turn, [full, free], [], [], waited_s=config.wait_limit_s)
    assert waited.target is free
    policy.on_complete(running[0], full, ok=True)
    again = request(prefix(100, 1, doc))
    assert policy.replica_cost(again, full, 16) == pytest.approx(on_profile(16) + 16 * RATE)
    assert policy.select(again, [full, free]) is full


def test_kv_look_ahead_prices_a_replica_that_would_overflow() -> None:
    config = MeridianConfig(kv_capacity_tokens=4096, lookahead_tokens=100, harm_weight=0.0)
    policy = MeridianPolicy(config)
    full, empty = target("full"), target("empty")
    policy.select(sized(3900, "r1", output=500), [full])
    policy.observe_first_token(sized(3900, "r1"), "full", on_profile(3900))
    # r1 holds 3,900 + min(500, 100) = 4,000 tokens of the look-ahead.
    assert policy.replicas["full"].kv_tokens == 4000
    newcomer = sized(200, "n", output=50)
    overflow = 4000 + 250 - 4096
    lifetime = policy.mean_output * config.itl_s
    extra = policy.replica_cost(newcomer, full, 200) - policy.replica_cost(newcomer, empty, 200)
    assert extra == pytest.approx(overflow * lifetime / 4000)
    # The probe's KV usage counts too, when it shows more than the ledger.
    policy.observe_probe("empty", 0.99)
    assert policy.replica_cost(newcomer, empty, 200) > policy.replica_cost(newcomer, full, 200)


def test_a_cached_prefix_adds_no_kv_where_it_is_held() -> None:
    # Requests sharing a system prompt hold its KV once: a holder's look-ahead grows
    # by a newcomer's uncached tokens and decode only, a cold replica's by all of it.
    config = MeridianConfig(
        kv_capacity_tokens=4096, lookahead_tokens=100, harm_weight=0.0, decode_weight=0.0
    )
    policy = MeridianPolicy(config)
    holder, cold = target("holder"), target("cold")
    system = prefix(1, 150)  # 2,400 tokens
    first = replace(request(prefix(2, 4, system)), predicted_output_tokens=100)
    policy.select(first, [holder])
    policy.observe_first_token(first, "holder", on_profile(first.prompt_tokens))
    assert policy.replicas["holder"].kv_tokens == 2464 + 100
    second = replace(request(prefix(3, 4, system)), predicted_output_tokens=100)
    # 64 new tokens and 100 of decode fit beside the first request's 2,564.
    assert policy.replica_cost(second, holder, 64) == pytest.approx(on_profile(64))
    assert policy.select(second, [holder, cold]) is holder
    assert policy.replicas["holder"].kv_tokens == 2564 + 164
    policy.observe_first_token(second, "holder", on_profile(64))
    # A third, cold on the holder too (2,464 tokens it lacks), would overflow it.
    third = sized(2464, "third", output=100)
    overflow = 2728 + 2564 - 4096
    lifetime = policy.replicas["holder"].mean_output * config.itl_s
    extra = policy.replica_cost(third, holder, 2464) - policy.replica_cost(third, cold, 2464)
    assert extra == pytest.approx(overflow * lifetime / 2728)


def test_the_admission_limit_is_queued_prefill_tokens() -> None:
    policy = MeridianPolicy(MeridianConfig(admission_tokens=1000))
    a = target("a")
    assert policy.admits(a)  # never seen: idle
    policy.select(sized(600, "x"), [a])
    assert policy.admits(a)
    policy.select(sized(600, "y"), [a])
    assert not policy.admits(a)  # 1,200 queued
    policy.observe_first_token(sized(600, "x"), "a", 0.4)
    assert policy.admits(a)  # x is decoding: 600 queued
    policy.on_complete(sized(600, "y"), a, ok=False)
    assert policy.replicas["a"].queued_prefill == 0
    policy.on_complete(sized(600, "x"), a, ok=True)
    assert (policy.replicas["a"].decoding, policy.replicas["a"].kv_tokens) == (0, 0)


def test_a_longest_prefix_first_engine_admits_what_it_caches_past_the_limit() -> None:
    # Behind SGLang's scheduler: the holder decodes a 2,400-token conversation and has
    # 1,200 tokens of prefill queued, past the 1,000-token limit.  Its engine serves
    # the next turn (2,400 tokens cached) ahead of colder waiting requests as soon as
    # it has room, so it admits it; held here, the turn would go in arrival order.
    config = MeridianConfig(admission_tokens=1000, engine_queue="lpm")
    holder, cold = target("holder"), target("cold")
    system = prefix(1, 150)  # 2,400 tokens

    def busy_holder(policy: MeridianPolicy) -> None:
        first = request(system)
        policy.select(first, [holder])
        policy.observe_first_token(first, "holder", on_profile(2400))
        policy.select(sized(1200, "backlog"), [holder])

    policy = MeridianPolicy(config)
    busy_holder(policy)
    assert not policy.admits(holder)
    turn = request(prefix(2, 2, system))
    choice = policy.choose(turn, [cold], [holder], [])
    assert choice.option is Option.REPLICA and choice.target is holder
    # First come, first served engines (vLLM's, the default): the turn waits here.
    fcfs = MeridianPolicy(replace(config, engine_queue="fcfs"))
    busy_holder(fcfs)
    assert fcfs.choose(turn, [cold], [holder], []).option is Option.WAIT
    # A prompt the holder caches no more than affinity_tokens of is held as before:
    # the engine would put it behind the warmer ones anyway, and here it may still
    # go to whichever replica frees first.
    short = request(prefix(3, 40, prefix(1, 16)))  # 256 tokens cached of 896
    assert policy.choose(short, [], [holder], []).option is Option.WAIT
    with pytest.raises(ValueError, match="engine_queue must be one of fcfs, lpm"):
        MeridianConfig(engine_queue="sjf")
    with pytest.raises(Exception, match="engine_queue"):
        build_policy("meridian", {"engine_queue": 1})


def test_engines_that_schedule_by_priority_start_cached_turns_before_cold_copies() -> None:
    # vLLM with --scheduling-policy priority serves lower values first and preempts
    # higher ones first: a cold copy into a cache whose look-ahead has no room for it
    # goes as COLD_COPY_PRIORITY, so cached turns are not queued behind it while their
    # history ages in the LRU; every other request keeps the default, arrival order.
    policy = MeridianPolicy(MeridianConfig(engine_queue="priority", kv_capacity_tokens=2000))
    holder = target("holder")
    history = prefix(1, 40)  # 640 tokens (+256 decoding in the look-ahead)
    first = policy.choose(request(history), [holder], [], [])
    assert first.option is Option.REPLICA and first.priority == DEFAULT_PRIORITY  # room
    turn = policy.choose(request(prefix(2, 4, history)), [holder], [], [])
    assert turn.target is holder and turn.priority == DEFAULT_PRIORITY  # cached
    cold = policy.choose(request(prefix(3, 40)), [holder], [], [])
    assert cold.target is holder and cold.priority == COLD_COPY_PRIORITY  # 2,112 > 2,000
    short = request(prefix(4, 40, prefix(1, 16)))  # 256 tokens cached: no more than the slack
    assert policy.choose(short, [holder], [], []).priority == COLD_COPY_PRIORITY
    again = policy.choose(request(prefix(5, 2, history)), [holder], [], [])
    assert again.priority == DEFAULT_PRIORITY  # a full cache, but this turn is cached
    # A wait carries none (it is given where the request is sent), nor does any choice
    # for other engines, which would not read it: their bodies go as the client sent them.
    assert policy.choose(request(prefix(6, 4)), [], [], []).priority is None
    assert MeridianPolicy().choose(request(history), [holder], [], []).priority is None


def test_waiting_for_the_held_back_holder_beats_a_cold_replica() -> None:
    # Prices alone (no prefix affinity: see the affinity test below).
    policy = MeridianPolicy(MeridianConfig(admission_tokens=1000, affinity_tokens=1 << 20))
    holder, cold = target("holder"), target("cold")
    doc = prefix(1, 150)  # 2,400 tokens
    first = request(doc)
    policy.select(first, [holder])  # the holder now queues 2,400 tokens: held back
    assert not policy.admits(holder)
    # Behind 2,400 queued tokens, 32 uncached ones cost what 2,432 cold ones do:
    # a tie goes to the replica that can start now.
    choice = policy.choose(request(prefix(2, 2, doc)), [cold], [holder], [])
    assert choice.option is Option.REPLICA and choice.target is cold
    # The document prefilled, the holder queues another prompt's 1,500 tokens:
    # 1,532 tokens' wait for it beats 2,432 cold tokens now.
    policy.observe_first_token(first, "holder", on_profile(2400))
    policy.select(sized(1500, "tail"), [holder])
    assert not policy.admits(holder)
    choice = policy.choose(request(prefix(3, 2, doc)), [cold], [holder], [])
    assert choice.option is Option.WAIT and choice.target is None
    # After wait_limit_s the admission limit is waived: the holder takes it at once.
    late = policy.choose(request(prefix(4, 2, doc)), [cold], [holder], [], waited_s=1.0)
    assert late.option is Option.REPLICA and late.target is holder


def test_prefix_affinity_waits_for_the_holder_until_the_wait_limit() -> None:
    # A cold copy of a shared prefix pins KV for as long as the prefix is in use,
    # which no price of the present sees: within wait_limit_s a replica lacking more
    # than affinity_tokens of what the holder caches is reached only by waiting.
    policy = MeridianPolicy(
        MeridianConfig(admission_tokens=1000, affinity_tokens=256, decode_weight=0.0)
    )
    holder, near, cold = target("holder"), target("near"), target("cold")
    system = prefix(1, 150)  # 2,400 tokens
    policy.select(request(system), [holder])
    assert not policy.admits(holder)
    turn = request(prefix(2, 2, system))
    # Idle "cold" is cheaper now (2,432 tokens against 2,400 queued + 32), but it
    # lacks the 2,400 tokens the holder caches: wait for the holder.
    assert policy.uncached_by_target(turn, {"holder", "cold"}) == {"holder": 32}
    choice = policy.choose(turn, [cold], [holder], [])
    assert choice.option is Option.WAIT
    # Once the request has waited wait_limit_s, every replica is an option again.
    late = policy.choose(turn, [cold], [holder], [], waited_s=policy.config.wait_limit_s)
    assert late.option is Option.REPLICA and late.target is cold
    # A replica within affinity_tokens of the holder's match stays an option.
    other = request(prefix(3, 10, system))
    policy.select(other, [near])  # near holds the 2,400 too
    policy.observe_first_token(other, "near", on_profile(2560))
    assert policy.choose(request(prefix(4, 2, system)), [near, cold], [holder], []).target is near
    # A prompt the holder saves no more than affinity_tokens of is not held back.
    short = request(prefix(5, 20, prefix(1, 10)))  # 160 tokens cached of 480
    assert policy.choose(short, [target("idle")], [holder], []).option is Option.REPLICA


def test_after_the_wait_limit_a_cold_copy_that_must_evict_is_no_option() -> None:
    # 4k-token caches: a 2,400-token prefix copied onto a replica whose KV look-ahead
    # is full would evict what it holds (the thrashing regime), so after the wait
    # limit the holder takes the request even where the copy is priced cheaper.
    # (Copies up to the whole cache are allowed here: the share is tested below.)
    config = MeridianConfig(admission_tokens=1000, kv_capacity_tokens=4096, max_copy_share=1.0)
    policy = MeridianPolicy(config)
    holder, full, roomy = target("holder"), target("full"), target("roomy")
    system = prefix(1, 150)  # 2,400 tokens
    held_back_holding(policy, holder, system)
    policy.select(sized(2000, "other-work"), [full])
    policy.observe_first_token(sized(2000, "other-work"), "full", on_profile(2000))
    turn = request(prefix(2, 2, system))
    waited = config.wait_limit_s
    # "full" is cheaper by the prices (nothing queued against the holder's 10,400
    # tokens), but the copy does not fit beside its 2,000 decoding tokens: no option.
    assert policy.replica_cost(turn, full, 2432) < policy.replica_cost(turn, holder, 32)
    late = policy.choose(turn, [full], [holder], [], waited_s=waited)
    assert late.option is Option.REPLICA and late.target is holder
    # A replica with room for the copy stays an option, and the prices decide.
    assert policy.choose(turn, [full, roomy], [holder], [], waited_s=waited).target is roomy


def test_after_the_wait_limit_a_copy_over_the_share_of_a_cache_is_no_option() -> None:
    # 8k-token caches and a 2,400-token system prompt (29 % of a cache): an idle
    # replica has room for the copy now, but it would pin that share for every later
    # turn that follows it there, so past the wait limit the busy holder keeps it.
    config = MeridianConfig(admission_tokens=1000, kv_capacity_tokens=8192)
    policy = MeridianPolicy(config)
    holder, idle = target("holder"), target("idle")
    system = prefix(1, 150)  # 2,400 tokens
    policy.select(request(system), [holder])
    policy.select(sized(6000, "backlog"), [holder])
    turn = request(prefix(2, 2, system))
    waited = config.wait_limit_s
    assert policy.replica_cost(turn, idle, 2432) < policy.replica_cost(turn, holder, 32)
    assert policy.choose(turn, [idle], [holder], [], waited_s=waited).target is holder
    # A share that admits the copy leaves the prices to decide, as before.
    lenient = MeridianPolicy(replace(config, max_copy_share=0.5))
    lenient.select(request(system), [holder])
    lenient.select(sized(6000, "backlog"), [holder])
    assert lenient.choose(turn, [idle], [holder], [], waited_s=waited).target is idle
    with pytest.raises(ValueError, match="max_copy_share"):
        MeridianConfig(max_copy_share=0.0)


def test_a_request_whose_prefix_is_held_here_is_forwarded_only_when_no_kv_room_is_left() -> None:
    config = MeridianConfig(admission_tokens=1000, kv_capacity_tokens=4096)
    policy = MeridianPolicy(config)
    home, eu = target("home"), peer("eu", rtt_ms=80.0)
    system = prefix(1, 150)  # 2,400 tokens
    policy.select(request(system), [home])
    turn = request(prefix(2, 2, system))
    waited = config.wait_limit_s
    # Before the wait limit a forward is a cold copy like any other: wait for the holder.
    assert policy.choose(turn, [], [home], [eu]).option is Option.WAIT
    # After it, the home holder still has KV room for the turn: it takes it.
    assert policy.choose(turn, [], [home], [eu], waited_s=waited).target is home
    # Home's look-ahead full (seconds of prefill past capacity): the peer is an option.
    policy.select(sized(3000, "burst"), [home])
    assert policy.choose(turn, [], [home], [eu], waited_s=waited).option is Option.PEER
    # A prompt nothing here caches is forwarded on price alone, as before.
    assert policy.choose(sized(500, "new"), [], [home], [eu]).option is Option.PEER


def test_a_first_turn_whose_copy_pins_little_is_priced_abroad_at_once() -> None:
    # 32k-token caches, a 2,400-token system prompt home holds: a later turn of a
    # conversation waits for its holder, but a first turn carries no history of its
    # own (what home caches of it was cached for others), so the peer is priced now.
    config = MeridianConfig(admission_tokens=1000)
    policy = MeridianPolicy(config)
    home, eu = target("home"), peer("eu", rtt_ms=80.0)
    system = prefix(1, 150)
    held_back_holding(policy, home, system)
    later = request(prefix(2, 2, system))
    first = replace(later, first_turn=True)
    assert policy.choose(later, [], [home], [eu]).option is Option.WAIT
    assert policy.choose(first, [], [home], [eu]).option is Option.PEER
    # Over max_copy_share of a cache (8k tokens here: 29 %), the copy would pin that
    # share abroad for the conversation's later turns: the gate holds, as for any turn.
    small = MeridianPolicy(replace(config, kv_capacity_tokens=8192))
    held_back_holding(small, home, system)
    assert small.choose(first, [], [home], [eu]).option is Option.WAIT


def test_a_program_living_at_a_peer_follows_it_there_before_the_wait_limit() -> None:
    config = MeridianConfig(admission_tokens=1000, kv_capacity_tokens=4096)
    policy = MeridianPolicy(config)
    home, eu, ap = target("home"), peer("eu", rtt_ms=80.0), peer("ap", rtt_ms=80.0)
    system = prefix(1, 150)  # 2,400 tokens
    policy.select(request(system), [home])
    policy.select(sized(3000, "burst"), [home])  # home's look-ahead full
    turn = request(prefix(2, 2, system))
    waited = config.wait_limit_s
    assert policy.choose(turn, [], [home], [eu], waited_s=waited).target is eu
    # The next turn extends what went to eu: no cold copy there, so no wait limit;
    # a peer holding less of it than home still waits for it.
    follow_up = request(prefix(3, 2, prefix(2, 2, system)))
    assert policy.choose(follow_up, [], [home], [ap, eu]).target is eu
    assert policy.choose(follow_up, [], [home], [ap]).option is Option.WAIT


def test_a_program_follows_a_held_back_peer_and_nothing_else_goes_there() -> None:
    config = MeridianConfig(admission_tokens=1000, kv_capacity_tokens=4096)
    policy = MeridianPolicy(config)
    home, eu = target("home"), peer("eu", rtt_ms=80.0)
    policy.select(sized(3000, "burst"), [home])  # home queues 3,000 tokens of prefill
    question = request(prefix(1, 30))  # 480 tokens nobody holds
    assert policy.choose(question, [], [home], [eu]).target is eu
    # eu has no room now (held back): the program's next request still follows it,
    # to wait in eu's queue rather than copy the whole program cold here ...
    branch = request(prefix(2, 4, prefix(1, 30)))
    follow = policy.choose(branch, [], [home], [], held_back_peers=[eu])
    assert follow.target is eu
    # Its price counts the requests eu says it queues, each a typical one here,
    # spread over eu's healthy replicas; a long enough queue keeps it home.
    empty = policy.choose(branch, [], [home], [], held_back_peers=[eu])
    eu.waiting, eu.extra["healthy_replicas"] = 10, 2.0
    queued = policy.choose(branch, [], [home], [], held_back_peers=[eu])
    typical_s = policy.mean_uncached * RATE
    assert queued.cost_s - empty.cost_s == pytest.approx(10 * typical_s / 2)
    eu.waiting = 1000
    assert policy.choose(branch, [], [home], [], held_back_peers=[eu]).option is Option.WAIT
    eu.waiting = 0
    # ... but a prompt eu holds no more of than home is no reason to queue there.
    assert policy.choose(sized(480, "new"), [], [home], [], held_back_peers=[eu]).option is (
        Option.WAIT
    )
    # Nor is a program that lives here.
    local = request(prefix(3, 30))
    policy.select(local, [home])
    turn = request(prefix(4, 2, prefix(3, 30)))
    assert policy.choose(turn, [], [home], [], held_back_peers=[eu]).option is Option.WAIT


def test_queued_requests_ahead_make_waiting_dearer() -> None:
    policy = MeridianPolicy(
        MeridianConfig(admission_tokens=100, affinity_tokens=1 << 20, decode_weight=0.0)
    )
    holder, cold = target("holder"), target("cold")
    first = request(prefix(1, 20))
    policy.select(first, [holder])
    policy.observe_first_token(first, "holder", on_profile(320))
    policy.select(sized(200, "busy"), [holder])
    follow_up = request(prefix(2, 1, first.block_hashes))
    assert policy.choose(follow_up, [cold], [holder], []).option is Option.WAIT
    crowded = policy.choose(follow_up, [cold], [holder], [], queued_ahead=400)
    assert crowded.target is cold


def test_forward_only_when_the_peer_is_genuinely_cheaper() -> None:
    policy = MeridianPolicy()
    local, near = target("local"), peer("eu", rtt_ms=80.0)
    prompt = sized(500, "p")
    # Idle local replica: forwarding adds the RTT for nothing.
    assert policy.choose(prompt, [local], [], [near]).target is local
    # Nothing local admits: the peer beats a long wait.
    held_back_holding(policy, local)
    choice = policy.choose(sized(500, "q"), [], [local], [near])
    assert choice.option is Option.PEER and choice.target is near
    # A peer that says it queues for seconds is dearer than waiting here.
    slow = peer("ap", rtt_ms=150.0, estimate_s=10.0)
    assert policy.choose(sized(500, "r"), [], [local], [slow]).option is Option.WAIT
    # Of two peers, the nearer one after its own estimate.
    pick = policy.choose(sized(500, "s"), [], [], [peer("x", 200.0), peer("y", 80.0, 0.05)])
    assert pick.target is not None and pick.target.target_id == "y"


def test_a_home_wait_past_the_slo_costs_a_request_lifetime_where_a_peer_meets_it() -> None:
    # Home holds a 640-token document and queues 3,000 more tokens ahead of a
    # follow-up that adds 64: its first token is 2.03 s out, past the 2 s SLO.  The
    # peer answers in 1.48 s (its second of queue, the round trip, the whole prompt's
    # prefill) but costs more: the follow-up's reply is lost to home's caches, and
    # the cold copy displaces as many tokens there.
    config = MeridianConfig(
        ewma_alpha=1.0, decode_weight=0.0, admission_tokens=1 << 20, affinity_tokens=1 << 20
    )
    home, eu = target("home"), peer("eu", rtt_ms=80.0, estimate_s=1.0)
    doc = prefix(1, 40)
    follow_up = replace(request(prefix(3, 4, doc)), predicted_output_tokens=2000)

    def decide(slo: float, prompt: RequestDescriptor = follow_up) -> tuple[Option, float, float]:
        policy = MeridianPolicy(replace(config, ttft_slo_s=slo))
        policy.select(sized(3000, "backlog"), [home])
        policy.select(request(doc), [home])
        policy.select(request(prefix(2, 4, doc)), [home])  # 91 % cached: reuse
        choice = policy.choose(prompt, [home], [], [eu])
        held = policy.uncached_by_target(prompt, {"home"}).get("home", prompt.prompt_tokens)
        return choice.option, policy.replica_cost(prompt, home, held), choice.cost_s

    option, home_cost, peer_cost = decide(2.0)
    lifetime = config.default_output_tokens * config.itl_s  # nothing finished yet
    assert option is Option.PEER and home_cost < peer_cost < home_cost + lifetime
    # No SLO, or one home meets (2.03 s), or one both miss: the cheaper home takes it.
    for slo in (0.0, 2.5, 1.0):
        assert decide(slo)[0] is Option.REPLICA
    # A prompt home holds none of (a document) pays no miss: it would take the
    # document from the caches that serve it here, as the locality term prices.
    # Home's wait for it is 2.37 s; a miss priced there would send it abroad.
    assert decide(2.0, sized(704, "document", output=2000))[0] is Option.REPLICA


def test_a_forward_pays_for_the_locality_it_leaves_behind() -> None:
    config = MeridianConfig(ewma_alpha=1.0, kv_capacity_tokens=4096, decode_weight=0.0)
    policy = MeridianPolicy(config)
    home, near = target("home"), peer("eu", rtt_ms=80.0)
    doc = prefix(1, 40)
    # Home holds the document and queues seconds of prefill past its KV capacity:
    # once the request has waited the wait limit, the peer is the choice.
    held_back_holding(policy, home, doc)
    follow_up = request(prefix(2, 4, doc))
    waited = config.wait_limit_s
    # Nothing routed yet was cached: no later request is expected to reuse this one.
    assert policy.reuse == 0.0
    unlearned = policy.choose(follow_up, [], [home], [near], waited_s=waited).cost_s
    # A routed prompt that was 90 % cached teaches that most requests extend an earlier one.
    policy.select(request(prefix(3, 4, doc)), [home])
    assert policy.reuse == pytest.approx(1 - 64 / 704)
    # Another peer: ``near`` now holds the follow-up (it was just forwarded there).
    learned = policy.choose(follow_up, [], [home], [peer("ap", rtt_ms=80.0)], waited_s=waited)
    # The follow-up would leave 64 new tokens and its reply missing at home, and its
    # cold copy (all 704 tokens: ap holds none) displaces as many of ap's own.
    lost = policy.reuse * (64 + policy.predicted_output(follow_up)) * RATE
    displaced = policy.reuse * 704 * RATE
    assert learned.option is Option.PEER
    assert learned.cost_s - unlearned == pytest.approx(lost + displaced)


def test_a_peer_pays_harm_to_its_decoders_like_a_replica() -> None:
    policy = MeridianPolicy(NO_DECODE)
    local, near = target("local"), peer("eu", rtt_ms=80.0)
    idle = policy.choose(sized(500, "a"), [], [], [near]).cost_s
    busy = sized(100, "busy")
    policy.select(busy, [local])
    policy.observe_first_token(busy, "local", on_profile(100))
    # One request decoding on the one local replica: the fleet's mean is one decoder.
    harmed = policy.choose(sized(500, "b"), [], [], [near]).cost_s
    assert harmed - idle == pytest.approx(policy.config.harm_weight * 500 * RATE)


def test_decode_terms_send_a_request_from_large_batches_to_a_region_with_small_ones() -> None:
    policy = MeridianPolicy()
    config = policy.config
    local = target("local")
    for i in range(10):
        running = sized(100, f"run{i}")
        policy.select(running, [local])
        policy.observe_first_token(running, "local", on_profile(100))
    # Without a peer the choice is priced by the time to first token alone.
    alone = sized(100, "alone", output=100)
    ttft_only = policy.replica_cost(alone, local, 100)
    assert policy.choose(alone, [local], [], []).cost_s == pytest.approx(ttft_only)
    policy.on_complete(alone, local, ok=True)
    policy.reuse = 1.0  # every request extends an earlier one: programs in a closed loop
    # An idle region 80 ms away: one sequence per step there, against eleven here.
    idle = {"rtt_ms": 80.0, "estimate_s": 0.0, "prefill_s_per_token": RATE}
    eu = target("eu", extra={**idle, "decode_s_per_token": config.step_s + config.seq_s})
    probe = sized(100, "probe", output=100)
    here = policy.replica_cost(probe, local, 100)
    here += 100 * (config.step_s + (11 + 10 * config.harm_weight) * config.seq_s)
    there = 0.08 + 100 * RATE + 100 * (config.step_s + config.seq_s) + config.step_s
    # The locality it leaves: the next turn's 100 tokens and this reply, harming ten here.
    there += (100 + 100) * RATE * (1 + 10 * config.harm_weight)
    # What its cold copy displaces there, at the peer's price.
    there += 100 * RATE
    assert there < here
    choice = policy.choose(probe, [local], [], [eu])
    assert choice.option is Option.PEER and choice.cost_s == pytest.approx(there)


def test_a_prompt_forwarded_to_a_peer_is_priced_there_by_what_it_lacks() -> None:
    policy = MeridianPolicy(NO_DECODE)
    home, near = target("home"), peer("eu", rtt_ms=80.0)
    held_back_holding(policy, home)
    doc = prefix(1, 40)
    first = policy.choose(request(doc), [], [home], [near])
    assert first.option is Option.PEER
    # The next turn extends what went to the peer: there it lacks only 4 blocks.
    follow_up = request(prefix(2, 4, doc))
    cold = policy.choose(follow_up, [], [home], [peer("ap", rtt_ms=80.0)])
    warm = policy.choose(follow_up, [], [home], [near])
    assert warm.option is Option.PEER and warm.target is near
    # 640 cached tokens fewer to prefill (nothing decodes here: no harm to add).
    assert cold.cost_s - warm.cost_s == pytest.approx(40 * 16 * RATE)
    # The tree keeps what went to the peers (the follow-up too) when local targets change.
    policy.on_targets_changed(["home"])
    assert policy.uncached_by_target(follow_up, {"eu", "home"}) == {"eu": 0}


def _said(*paths: tuple[int, ...]) -> PrefixDigest:
    """The digest of a peer whose replica holds ``paths``."""
    tree = RadixTree(10_000)
    for path in paths:
        tree.insert(path, "replica")
    return digest_of(tree, {"replica"}, block_tokens=16, min_stride=4, max_hashes=100)


def test_a_peer_that_says_what_it_holds_is_priced_by_it_and_by_forwards_since() -> None:
    doc = prefix(1, 40)
    home, near = target("home"), peer("eu", rtt_ms=80.0)

    def held_back() -> MeridianPolicy:
        policy = MeridianPolicy(NO_DECODE)
        held_back_holding(policy, home)
        return policy

    # Asked for the first time here, the peer says it holds the document already
    # (its own clients put it there): cheaper there by the 640 tokens it caches.
    told = held_back().choose(
        request(prefix(2, 4, doc)), [], [home], [near], peer_prefixes={"eu": _said(doc)}
    )
    blind = held_back().choose(request(prefix(2, 4, doc)), [], [home], [near])
    assert told.option is Option.PEER
    assert blind.cost_s - told.cost_s == pytest.approx(40 * 16 * RATE)
    # What went there since its report counts too: the report could not know it yet.
    policy = held_back()
    quiet = {"eu": _said()}
    assert policy.choose(request(doc), [], [home], [near], peer_prefixes=quiet).target is near
    follow_up = policy.choose(request(prefix(3, 4, doc)), [], [home], [near], peer_prefixes=quiet)
    assert follow_up.cost_s == pytest.approx(told.cost_s)
    # Its next report says it no longer holds the document (it arrived and was evicted:
    # a later tree, the same hashes): priced cold again, where a guess from the
    # forwards alone would still credit it.
    evicted = {"eu": replace(_said(), version=2)}
    again = policy.choose(request(prefix(4, 4, doc)), [], [home], [near], peer_prefixes=evicted)
    assert again.cost_s == pytest.approx(blind.cost_s)
    guessed = policy.choose(request(prefix(6, 4, doc)), [], [home], [near])
    assert guessed.cost_s == pytest.approx(told.cost_s)  # (the forward just made)
    # A digest of blocks of another size is of other hashes: ignored, the peer is
    # priced by what went there, as one that says nothing.
    other = {"eu": replace(_said(), block_tokens=32)}
    odd = held_back()
    odd.choose(request(doc), [], [home], [near], peer_prefixes={"eu": _said()})
    assert odd.choose(
        request(prefix(5, 4, doc)), [], [home], [near], peer_prefixes=other
    ).cost_s == pytest.approx(told.cost_s)


def test_a_peer_that_reports_its_prices_is_priced_by_them() -> None:
    policy = MeridianPolicy()
    config = policy.config
    local = target("local")
    busy = sized(100, "busy")
    policy.select(busy, [local])
    policy.observe_first_token(busy, "local", on_profile(100))
    policy.reuse = 1.0  # every request extends an earlier one: programs in a closed loop
    unpriced = peer("eu", rtt_ms=80.0, estimate_s=1.0)
    prices = {"prefill_s_per_token": RATE, "decode_s_per_token": 0.04}
    priced = target("ap", extra={"rtt_ms": 80.0, "estimate_s": 1.0, **prices})
    out = policy.predicted_output(sized(500, "x"))
    # Unpriced: this region's rate, decoders and decode terms stand in for the peer's.
    per_token = config.step_s + (2 + config.harm_weight) * config.seq_s
    # With reuse 1 a cold copy displaces as many tokens of the peer's own (last term).
    expected = 0.08 + 1.0 + 500 * RATE * 2 + out * per_token + config.step_s + 500 * RATE * 2
    assert policy.choose(sized(500, "a"), [], [], [unpriced]).cost_s == pytest.approx(expected)
    # Priced: its own prices per prompt and per output token.
    expected = 0.08 + 1.0 + 500 * RATE + out * 0.04 + config.step_s + 500 * RATE
    assert policy.choose(sized(500, "b"), [], [], [priced]).cost_s == pytest.approx(expected)


def test_unique_prompts_price_a_peer_by_this_regions_rates_without_decode_terms() -> None:
    policy = MeridianPolicy(MeridianConfig(ewma_alpha=1.0))
    local = target("local")
    for i in range(3):
        running = sized(100, f"run{i}")
        policy.select(running, [local])
        policy.observe_first_token(running, "local", on_profile(100))
    # Nothing routed was cached: no request waits on another's last token.
    assert policy.reuse == 0.0
    prices = {"prefill_s_per_token": RATE, "decode_s_per_token": 0.04}
    priced = target("ap", extra={"rtt_ms": 80.0, "estimate_s": 1.0, **prices})
    per_token = RATE * (1 + policy.config.harm_weight * 3)
    expected = 0.08 + 1.0 + 500 * per_token + policy.config.step_s
    assert policy.choose(sized(500, "u"), [], [], [priced]).cost_s == pytest.approx(expected)
    # A routed prompt that was fully cached: the peer's own prices and decode terms count.
    policy.select(request(prefix(1, 8)), [local])
    policy.select(request(prefix(1, 8)), [local])
    assert policy.reuse == 1.0
    out = policy.predicted_output(sized(500, "c"))
    # ... and so does what the cold copy displaces there (reuse 1: every token of it).
    expected = 0.08 + 1.0 + 500 * RATE + out * 0.04 + policy.config.step_s + 500 * RATE
    assert policy.choose(sized(500, "c"), [], [], [priced]).cost_s == pytest.approx(expected)


def test_region_prices_are_the_mean_over_its_replicas_harm_included() -> None:
    policy = MeridianPolicy()
    config = policy.config
    a, b = target("a"), target("b")
    for i in range(3):
        running = sized(100, f"run{i}")
        policy.select(running, [a])
        policy.observe_first_token(running, "a", on_profile(100))
    w = config.harm_weight
    prefill, decode = policy.region_prices([a, b])
    # A prompt token on a delays its three decoders too; on b only itself.
    assert prefill == pytest.approx(RATE * ((1 + 3 * w) + 1) / 2)
    # An output token on a is a step four sequences full, three of them slowed.
    step_a = config.step_s + (4 + 3 * w) * config.seq_s
    assert decode == pytest.approx((step_a + config.step_s + config.seq_s) / 2)
    assert all(math.isinf(x) for x in policy.region_prices([]))


def test_no_option_at_all_is_an_infinite_wait() -> None:
    choice = MeridianPolicy().choose(sized(10, "n"), [], [], [])
    assert choice.option is Option.WAIT and math.isinf(choice.cost_s)


def test_rates_are_learned_from_first_tokens_and_inter_token_latency() -> None:
    config = MeridianConfig(ewma_alpha=0.5)
    policy = MeridianPolicy(config)
    a = target("a")
    r = sized(1000, "r")
    policy.select(r, [a])
    # 1,000 tokens took 0.331 s - 1 ms RTT - 30 ms step = 0.3 s: 0.3 ms per token.
    policy.observe_first_token(r, "a", 0.331)
    assert policy.replicas["a"].prefill_s_per_token == pytest.approx((RATE + 0.3e-3) / 2)
    policy.observe_finish(r, "a", decode_s=2.0, output_tokens=101)
    assert policy.replicas["a"].itl_s == pytest.approx((config.itl_s + 0.02) / 2)
    assert policy.mean_output == pytest.approx((config.default_output_tokens + 101) / 2)
    # A tiny prefill says nothing about the rate: skipped.
    before = policy.replicas["a"].prefill_s_per_token
    small = sized(16, "small")
    policy.select(small, [a])
    policy.observe_first_token(small, "a", 5.0)
    assert policy.replicas["a"].prefill_s_per_token == before


H100_RATE = 0.04e-3


def remote(name: str, rtt_ms: float) -> TargetState:
    """A replica this balancer owns in another region, ``rtt_ms`` away."""
    return target(name, extra={"rtt_ms": rtt_ms})


def test_a_remote_replica_learns_the_true_rate_without_its_round_trip() -> None:
    config = MeridianConfig(prefill_s_per_token=H100_RATE)
    policy = MeridianPolicy(config)
    far, near = remote("far", 150.0), remote("near", 1.0)
    for n in range(20):
        for replica in (far, near):
            r = sized(12_000, f"{replica.target_id}-{n}")
            policy.select(r, [replica])
            rtt_s = replica.extra["rtt_ms"] / 1000.0
            # What the balancer measures: the round trip, one step, the prefill.
            policy.observe_first_token(
                r, replica.target_id, rtt_s + config.step_s + 12_000 * H100_RATE
            )
            policy.on_complete(r, replica, ok=True)
    # Folding the 150 ms into the rate would have learned 0.0165 ms per token more.
    assert policy.replicas["far"].prefill_s_per_token == pytest.approx(H100_RATE)
    assert policy.replicas["near"].prefill_s_per_token == pytest.approx(H100_RATE)


def test_a_remote_replica_costs_its_round_trip_once() -> None:
    policy = MeridianPolicy()
    far, near = remote("far", 150.0), target("near")
    r = sized(2000, "r")
    extra_s = policy.replica_cost(r, far, 2000) - policy.replica_cost(r, near, 2000)
    assert extra_s == pytest.approx(0.150 - MeridianConfig().local_rtt_s)


def test_a_cold_prompt_crosses_the_ocean_only_when_the_queue_here_is_longer() -> None:
    policy = MeridianPolicy(MeridianConfig(prefill_s_per_token=H100_RATE, affinity_tokens=10**6))
    far, near = remote("far", 150.0), target("near")
    # 2,000 queued tokens at 0.04 ms: 80 ms of prefill ahead, less than the round trip.
    policy.select(sized(2000, "q1"), [near])
    assert policy.select(sized(8000, "a"), [near, far]) is near
    # 12,000 more (0.56 s in all): now the far replica is cheaper, RTT included.
    policy.select(sized(12_000, "q2"), [near])
    assert policy.select(sized(8000, "b"), [near, far]) is far


def test_the_predicted_output_falls_back_to_what_was_seen_capped_by_max_tokens() -> None:
    policy = MeridianPolicy(MeridianConfig(default_output_tokens=300))
    assert policy.predicted_output(sized(10, "a", output=42)) == 42
    assert policy.predicted_output(sized(10, "b")) == 300
    capped = RequestDescriptor("c", "m", 10, max_tokens=20)
    assert policy.predicted_output(capped) == 20


def test_region_estimate_is_the_least_queued_prefill_time() -> None:
    policy = MeridianPolicy()
    a, b = target("a"), target("b")
    policy.select(sized(400, "x"), [a])
    policy.select(sized(2000, "y"), [b])
    assert policy.region_estimate([a, b]) == pytest.approx(400 * RATE)
    a.healthy = False
    assert policy.region_estimate([a, b]) == pytest.approx(2000 * RATE)
    assert math.isinf(policy.region_estimate([]))


def test_region_estimate_counts_the_kv_look_ahead_of_a_typical_request() -> None:
    config = MeridianConfig(
        kv_capacity_tokens=4096, lookahead_tokens=100, ewma_alpha=1.0, decode_weight=0.0
    )
    policy = MeridianPolicy(config)
    a = target("a")
    first = sized(3900, "r1", output=500)
    policy.select(first, [a])
    policy.observe_first_token(first, "a", on_profile(3900))
    # Nothing queued, but a typical request (3,900 + 100 tokens) overflows the KV.
    overflow = 4000 + 4000 - 4096
    lifetime = policy.mean_output * config.itl_s
    assert policy.region_estimate([a]) == pytest.approx(overflow * lifetime / 4000)


def test_targets_that_left_are_forgotten() -> None:
    policy = MeridianPolicy()
    policy.select(request(prefix(1, 4)), [target("a")])
    policy.on_targets_changed(["b"])
    assert set(policy.replicas) == {"b"} and policy.tree.tenants() == []


# 300 tokens: most prompts (9-38 blocks of 16) are larger than the whole cache, and
# ledgers run far past it, where the walk's floor takes one request lifetime.
# 4 sequences per engine: the replicas' slot waits (which the walk's floors carry) vary.
@pytest.mark.parametrize("max_num_seqs", [256, 4])
@pytest.mark.parametrize("kv_capacity", [20_000, 300])
def test_the_indexed_walk_finds_the_cheapest_of_every_candidate(
    kv_capacity: int, max_num_seqs: int
) -> None:
    rng = random.Random(7)
    config = MeridianConfig(kv_capacity_tokens=kv_capacity, max_num_seqs=max_num_seqs)
    policy = MeridianPolicy(config)
    # Some replicas abroad: their round trip is priced in the walk as in replica_cost.
    targets = [remote(f"r{i:02d}", (0.0, 1.0, 80.0, 150.0)[i % 4]) for i in range(40)]
    for t in targets:
        policy.observe_probe(t.target_id, rng.random())
    docs = [prefix(d, 8) for d in range(6)]
    for n in range(300):
        doc = rng.choice(docs)
        r = request(prefix(1000 + n, rng.randrange(1, 30), doc))
        chosen = policy.select(r, rng.sample(targets, 25))
        assert chosen is not None
        if rng.random() < 0.6:
            policy.observe_first_token(r, chosen.target_id, rng.uniform(0.05, 3.0))
        if rng.random() < 0.3:
            policy.on_complete(r, chosen, ok=True)
        # Brute force over the same candidates: no cheaper one was skipped.
        probe = request(prefix(5000 + n, rng.randrange(1, 30), rng.choice(docs)))
        candidates = rng.sample(targets, 30)
        uncached = policy.uncached_by_target(probe, {t.target_id for t in candidates})
        prompt = probe.prompt_tokens
        costs = [
            policy.replica_cost(probe, t, uncached.get(t.target_id, prompt)) for t in candidates
        ]
        assert policy.choose(probe, candidates, [], []).cost_s == pytest.approx(min(costs))


# Prompts above the 4,096-token KV capacity: every cold replica carries pressure the
# walk's floor cannot see, so the walk prices nearly all of them (the inlined pricing).
@pytest.mark.parametrize("max_num_seqs", [256, 4])
def test_the_walk_prices_cold_replicas_exactly_as_replica_cost(max_num_seqs: int) -> None:
    rng = random.Random(11)
    config = MeridianConfig(
        kv_capacity_tokens=4096, affinity_tokens=10**6, max_num_seqs=max_num_seqs
    )
    policy = MeridianPolicy(config)
    targets = [remote(f"r{i:02d}", (0.0, 1.0, 80.0, 150.0)[i % 4]) for i in range(30)]
    for t in targets:
        policy.observe_probe(t.target_id, rng.random())
    for n in range(200):
        r = sized(rng.randrange(16, 9000), f"load-{n}", output=rng.randrange(1, 600))
        chosen = policy.select(r, rng.sample(targets, 20))
        assert chosen is not None
        if rng.random() < 0.5:
            policy.observe_first_token(r, chosen.target_id, rng.uniform(0.05, 3.0))
        if rng.random() < 0.3:
            policy.observe_finish(r, chosen.target_id, rng.uniform(0.1, 9.0), rng.randrange(2, 900))
        if rng.random() < 0.3:
            policy.on_complete(r, chosen, ok=True)
        probe = sized(rng.randrange(4000, 40_000), f"probe-{n}", output=rng.randrange(0, 600))
        candidates = rng.sample(targets, 25)
        queued_ahead = rng.randrange(0, 5)
        ahead = queued_ahead * policy.mean_uncached / len(candidates)
        costs = {
            t.target_id: policy.replica_cost(probe, t, probe.prompt_tokens)
            + ahead * policy.replicas[t.target_id].prefill_s_per_token
            for t in candidates
        }
        # As a wait (the extra tokens queued ahead count too), then as a replica:
        # the same cost to the last bit, so every decision stays what it was.
        wait = policy.choose(probe, [], candidates, [], queued_ahead=queued_ahead)
        assert wait.option is Option.WAIT and wait.cost_s == min(costs.values())
        costs = {
            t.target_id: policy.replica_cost(probe, t, probe.prompt_tokens) for t in candidates
        }
        choice = policy.choose(probe, candidates, [], [])
        assert choice.target is not None and choice.cost_s == min(costs.values())
        assert costs[choice.target.target_id] == choice.cost_s


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="admission_tokens"):
        MeridianConfig(admission_tokens=-1)
    with pytest.raises(ValueError, match="affinity_tokens"):
        MeridianConfig(affinity_tokens=-1)
    with pytest.raises(ValueError, match="decode_weight"):
        MeridianConfig(decode_weight=-1.0)
    with pytest.raises(ValueError, match="max_num_seqs"):
        MeridianConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        MeridianConfig(ttft_slo_s=-1.0)
    with pytest.raises(ValueError, match="ewma_alpha"):
        MeridianConfig(ewma_alpha=0.0)


def test_the_tree_dates_a_prompt_by_its_use_not_only_by_its_routing() -> None:
    # Bound 10 blocks.  The first prompt was routed first but finished last, so when the
    # third pushes the replica over its bound the engine's LRU (which frees blocks at the
    # finish) would evict the second prompt, and so does the tree.
    policy, a = MeridianPolicy(MeridianConfig(max_blocks_per_target=10)), target("a")
    first, second, third = request(prefix(1, 6)), request(prefix(2, 4)), request(prefix(3, 3))
    policy.select(first, [a])
    policy.select(second, [a])
    policy.observe_first_token(second, "a", 0.1)
    policy.observe_finish(second, "a", decode_s=1.0, output_tokens=20)
    policy.observe_first_token(first, "a", 0.2)
    policy.observe_finish(first, "a", decode_s=1.0, output_tokens=20)
    policy.select(third, [a])
    assert policy.uncached_by_target(request(prefix(1, 6)), {"a"}) == {"a": 0}
    assert policy.uncached_by_target(request(prefix(2, 4)), {"a"}) == {}
    assert policy.tree.size("a") == 9


def test_the_tree_takes_no_kv_events_unless_asked() -> None:
    assert MeridianPolicy().kv_sink is None
    assert MeridianPolicy(MeridianConfig(tree_from_kv_events=True)).kv_sink is not None


def test_a_block_the_engine_evicted_cuts_its_replicas_hold_from_there() -> None:
    config = MeridianConfig(tree_from_kv_events=True, max_blocks_per_target=64)
    policy, a = MeridianPolicy(config), target("a")
    sink = policy.kv_sink
    assert sink is not None
    doc = prefix(1, 40)
    first = request(doc)
    policy.select(first, [a])
    policy.observe_first_token(first, "a", 0.1)
    sink.apply_stored("a", doc)  # a publishes events: its bound only caps memory now
    assert policy.following == {"a"}
    sink.apply_removed("a", doc[10:12])
    assert policy.uncached_by_target(request(doc), {"a", "b"}) == {"a": 30 * 16}
    # A cleared cache drops the replica from the tree (it still follows the replica).
    sink.clear("a")
    assert policy.uncached_by_target(request(doc), {"a"}) == {}
    assert policy.following == {"a"}
    policy.on_targets_changed(["b"])
    assert policy.following == set()


def test_an_eviction_reported_before_a_prompt_is_prefilled_does_not_cut_it() -> None:
    # The engine evicted an older copy; the prompt just routed there brings it back.
    policy = MeridianPolicy(MeridianConfig(tree_from_kv_events=True))
    a = target("a")
    sink = policy.kv_sink
    assert sink is not None
    doc = prefix(2, 8)
    sink.apply_stored("a", ())
    policy.select(request(doc), [a])
    sink.apply_removed("a", doc[:1])
    assert policy.uncached_by_target(request(doc), {"a"}) == {"a": 0}


def test_a_followed_replica_keeps_twice_its_cache_in_the_tree() -> None:
    config = MeridianConfig(tree_from_kv_events=True, max_blocks_per_target=10)
    policy, a, b = MeridianPolicy(config), target("a"), target("b")
    sink = policy.kv_sink
    assert sink is not None
    sink.apply_stored("a", ())
    for tag in range(3):  # 18 blocks on each: past b's bound of 10, within a's 20
        policy.select(request(prefix(10 + tag, 6)), [a])
        policy.select(request(prefix(20 + tag, 6)), [b])
    assert policy.tree.size("a") == 18
    assert policy.tree.size("b") <= 10
