"""SGLang cache-aware policy: cache threshold, smallest tree, imbalance fallback that records."""

from __future__ import annotations

from core.policies.sglang import SGLangConfig, SGLangPolicy
from tests.support.descriptors import prefix, request, target


def test_a_match_above_the_threshold_sticks_to_the_holder() -> None:
    policy = SGLangPolicy(SGLangConfig(cache_threshold=0.5))
    a, b = target("a", outstanding=3), target("b")
    doc = prefix(1, 8)
    policy.select(request(doc), [a])
    # 8 of 10 blocks cached on a: above 0.5, so a wins despite its load.
    assert policy.select(request(prefix(2, 2, doc)), [a, b]) is a


def test_below_the_threshold_the_smallest_tree_takes_the_request() -> None:
    policy = SGLangPolicy(SGLangConfig(cache_threshold=0.5))
    a, b, c = target("a"), target("b"), target("c", outstanding=2)
    policy.select(request(prefix(1, 20)), [a])
    policy.select(request(prefix(2, 5)), [b])
    # 2 of 10 blocks match on a (0.2 < 0.5): c has the emptiest tree, even though busier.
    assert policy.select(request(prefix(3, 8, prefix(1, 2))), [a, b, c]) is c
    # A prompt shorter than a block has no match at all.
    assert policy.select(request(), [a, b]) is b


def test_imbalance_uses_least_load_but_still_records_the_prefix() -> None:
    policy = SGLangPolicy(
        SGLangConfig(cache_threshold=0.1, balance_abs_threshold=4, balance_rel_threshold=2.0)
    )
    holder, idle = target("holder", outstanding=10), target("idle", outstanding=1)
    doc = prefix(1, 6)
    policy.select(request(doc), [holder])
    assert policy.imbalanced([holder, idle])
    assert policy.select(request(doc), [holder, idle]) is idle
    assert policy.tree.match(doc, {"idle"}) == (6, {"idle"})
    # Balanced again: both hold the prefix; the less loaded holder takes it.
    holder.outstanding, idle.outstanding = 3, 2
    assert not policy.imbalanced([holder, idle])
    assert policy.select(request(doc), [holder, idle]) is idle


def test_imbalance_needs_both_the_absolute_and_the_relative_gap() -> None:
    policy = SGLangPolicy(SGLangConfig(balance_abs_threshold=4, balance_rel_threshold=2.0))
    assert not policy.imbalanced([target("a", outstanding=20), target("b", outstanding=15)])
    assert not policy.imbalanced([target("a", outstanding=5), target("b", outstanding=2)])
    assert policy.imbalanced([target("a", outstanding=9), target("b", outstanding=2)])


def test_departed_targets_leave_the_tree() -> None:
    policy = SGLangPolicy()
    policy.select(request(prefix(1, 4)), [target("a")])
    policy.on_targets_changed(["b"])
    assert policy.tree.tenants() == []
