"""Selective pushing's availability rules (SkyLB §3.3): SP-P, SP-O, blind and tokens."""

from __future__ import annotations

import pytest

from core.availability import (
    AvailabilityLimits,
    ProbeMark,
    PushingConfig,
    PushingMode,
    is_available,
    probe_would_help,
    split_pushing_params,
)
from core.types import TargetState

LIMITS = AvailabilityLimits(max_outstanding=3, probe_stale_s=2.0)
SP_P = PushingConfig(PushingMode.SP_P)


def _target(*, outstanding: int = 0, healthy: bool = True) -> TargetState:
    return TargetState("a", "http://a", outstanding=outstanding, healthy=healthy)


def _probed(
    *, waiting: int = 0, running: int = 0, outstanding: int = 0, at: float = 10.0
) -> ProbeMark:
    mark = ProbeMark()
    mark.on_probe(at, running=running, waiting=waiting, outstanding=outstanding)
    return mark


def test_sp_p_counts_pushes_since_the_probe_and_a_probe_resets_them() -> None:
    target, mark = _target(), _probed()
    assert is_available(target, mark, SP_P, LIMITS, now=10.1)
    mark.on_push()
    target.outstanding = 1
    assert not is_available(target, mark, SP_P, LIMITS, now=10.1)
    # The next probe shows the pushed request running and nothing waiting: room again.
    mark.on_probe(10.3, running=1, waiting=0, outstanding=1)
    assert is_available(target, mark, SP_P, LIMITS, now=10.3)


def test_sp_p_probe_showing_waiting_requests_makes_the_replica_unavailable() -> None:
    mark = _probed(waiting=2, running=8, outstanding=10)
    assert not is_available(_target(outstanding=10), mark, SP_P, LIMITS, now=10.1)


def test_sp_p_requests_the_probe_has_not_seen_yet_still_count() -> None:
    # Three outstanding, the engine shows one: two are on the wire, maybe waiting.
    mark = _probed(running=1, outstanding=3)
    assert mark.unconfirmed == 2
    budget3 = PushingConfig(PushingMode.SP_P, push_budget=3)
    assert not is_available(_target(outstanding=3), mark, SP_P, LIMITS, now=10.1)
    assert is_available(_target(outstanding=3), mark, budget3, LIMITS, now=10.1)


def test_sp_p_a_finished_request_frees_a_slot_for_one_more_push() -> None:
    mark = _probed(running=4, outstanding=4)
    mark.on_push()
    assert not is_available(_target(outstanding=5), mark, SP_P, LIMITS, now=10.1)
    mark.on_finish()
    assert is_available(_target(outstanding=4), mark, SP_P, LIMITS, now=10.1)
    mark.on_finish()
    assert mark.unconfirmed == 0  # never negative


def test_sp_p_falls_back_to_the_sp_o_cap_without_a_fresh_probe() -> None:
    never = ProbeMark()
    assert is_available(_target(outstanding=2), never, SP_P, LIMITS, now=0.0)
    assert not is_available(_target(outstanding=3), never, SP_P, LIMITS, now=0.0)
    stale = _probed(waiting=5, at=10.0)
    assert not is_available(_target(), stale, SP_P, LIMITS, now=11.9)
    # Older than probe_stale_s: the waiting count says nothing any more.
    assert is_available(_target(outstanding=2), stale, SP_P, LIMITS, now=12.5)
    assert not is_available(_target(outstanding=3), stale, SP_P, LIMITS, now=12.5)


def test_sp_o_is_a_fixed_outstanding_cap_whatever_the_probe_says() -> None:
    sp_o = PushingConfig(PushingMode.SP_O)
    busy = _probed(waiting=9)
    assert is_available(_target(outstanding=2), busy, sp_o, LIMITS, now=10.1)
    assert not is_available(_target(outstanding=3), _probed(), sp_o, LIMITS, now=10.1)


def test_tokens_admits_by_the_policy_and_caps_only_an_engine_that_queues() -> None:
    tokens = PushingConfig(PushingMode.TOKENS)
    admitting, full = (lambda _: True), (lambda _: False)
    assert is_available(_target(outstanding=2), _probed(), tokens, LIMITS, 10.1, admitting)
    # The policy's admission limit (queued prefill tokens) holds whatever the count.
    assert not is_available(_target(), _probed(), tokens, LIMITS, 10.1, full)
    # Past SP-O's cap, an engine whose latest fresh probe queues nothing has batch room...
    at_cap = _target(outstanding=3)
    assert is_available(at_cap, _probed(running=3), tokens, LIMITS, 10.1, admitting)
    # ...one that queues is full, and without a fresh probe the cap holds.
    assert not is_available(at_cap, _probed(waiting=1), tokens, LIMITS, 10.1, admitting)
    assert not is_available(at_cap, ProbeMark(), tokens, LIMITS, 10.1, admitting)
    assert not is_available(at_cap, _probed(running=3), tokens, LIMITS, 12.5, admitting)
    # A policy that prices nothing (no admission limit) gets SP-O's cap.
    assert not is_available(at_cap, _probed(running=3), tokens, LIMITS, 10.1)
    assert is_available(_target(outstanding=2), _probed(waiting=4), tokens, LIMITS, 10.1)


def test_blind_pushing_takes_any_healthy_replica() -> None:
    blind = PushingConfig(PushingMode.BLIND)
    assert is_available(_target(outstanding=100), _probed(waiting=50), blind, LIMITS, now=10.1)
    assert not is_available(_target(healthy=False), ProbeMark(), blind, LIMITS, now=10.1)


def test_unhealthy_is_never_available_and_reprobing_helps_only_sp_p() -> None:
    for mode in PushingMode:
        config = PushingConfig(mode)
        assert not is_available(_target(healthy=False), _probed(), config, LIMITS, now=10.1)
    held = _probed(waiting=1)
    assert probe_would_help(_target(), held, SP_P, LIMITS, now=10.1)
    assert not probe_would_help(_target(), _probed(), SP_P, LIMITS, now=10.1)
    assert not probe_would_help(_target(), held, PushingConfig(PushingMode.SP_O), LIMITS, 10.1)


def test_pushing_keys_are_split_off_the_policy_params() -> None:
    config, rest = split_pushing_params({"pushing": "SP-O", "push_budget": 2, "k": 1})
    assert config == PushingConfig(PushingMode.SP_O, 2) and rest == {"k": 1}
    assert split_pushing_params({}) == (PushingConfig(), {})


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"pushing": "eager"}, "not one of: sp-p, sp-o, blind"),
        ({"push_budget": 0}, "at least 1"),
        ({"push_budget": "2"}, "must be an integer"),
        ({"push_budget": True}, "must be an integer"),
    ],
)
def test_bad_pushing_params_are_refused_clearly(params: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_pushing_params(params)
