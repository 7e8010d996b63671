"""Meridian's peers on their own: what each holds of a prompt (its digest and the
forwards since), and a forward's price from this region's terms."""

from __future__ import annotations

from dataclasses import replace

import pytest

from core.policies.meridian_peers import ForwardTerms, PeerHoldings, best_peer
from core.policy import Option
from core.prefix_digest import PrefixDigest, digest_of
from core.radix_tree import RadixTree
from tests.support.descriptors import prefix, request, target


def _said(*paths: tuple[int, ...]) -> PrefixDigest:
    tree = RadixTree(10_000)
    for path in paths:
        tree.insert(path, "replica")
    return digest_of(tree, {"replica"}, block_tokens=16, min_stride=4, max_hashes=100)


def test_a_peer_holds_what_it_said_or_what_went_there_since_whichever_is_more() -> None:
    tree = RadixTree(10_000)
    holdings = PeerHoldings(tree, block_tokens=16)
    eu, ap = target("eu"), target("ap")
    doc, other = prefix(1, 40), prefix(2, 40)
    report = {"eu": _said(doc)}
    turn = request(prefix(3, 4, doc))
    assert holdings.uncached(turn, [eu, ap], report) == {"eu": 64}
    # A forward of another document to eu, after that report: held there too.
    holdings.forwarded(request(other), "eu")
    assert holdings.uncached(request(prefix(4, 4, other)), [eu], report) == {"eu": 64}
    # eu's next report says it holds neither: the forward is forgotten with it.
    assert holdings.uncached(request(prefix(4, 4, other)), [eu], {"eu": _said()}) == {}
    # ap reports nothing: every forward there stays in the tree (the old guess).
    holdings.forwarded(request(other), "ap")
    assert holdings.uncached(request(prefix(5, 4, other)), [ap], {"eu": _said()}) == {"ap": 64}
    assert holdings.peer_ids == {"eu", "ap"}


def test_the_same_report_seen_again_keeps_the_forwards_since_it() -> None:
    tree = RadixTree(10_000)
    holdings = PeerHoldings(tree, block_tokens=16)
    report = {"eu": _said()}
    holdings.uncached(request(prefix(9, 1)), [target("eu")], report)
    holdings.forwarded(request(prefix(1, 40)), "eu")
    # The simulator hands the same report object until the peer's tree changes.
    assert holdings.uncached(request(prefix(1, 40)), [target("eu")], report) == {"eu": 0}


def test_a_report_decoded_anew_but_of_the_same_tree_version_is_no_news() -> None:
    tree = RadixTree(10_000)
    holdings = PeerHoldings(tree, block_tokens=16)
    eu = target("eu")
    holdings.uncached(request(prefix(9, 1)), [eu], {"eu": _said()})
    holdings.forwarded(request(prefix(1, 40)), "eu")
    # The live poller decodes every poll into a new object: equal, so the forward stays.
    polled = PrefixDigest.decode(_said().encode())
    assert holdings.uncached(request(prefix(1, 40)), [eu], {"eu": polled}) == {"eu": 0}
    # A later tree version with the same hashes is news: the forward went and was evicted.
    later = replace(polled, version=polled.version + 1)
    assert holdings.uncached(request(prefix(1, 40)), [eu], {"eu": later}) == {}


def test_only_digests_of_this_balancers_block_size_are_usable() -> None:
    holdings = PeerHoldings(RadixTree(10), block_tokens=16)
    mine, theirs = _said(), PrefixDigest(4, 32, frozenset())
    assert holdings.usable({"eu": mine, "ap": theirs}) == {"eu": mine}


def _terms(**changes: object) -> ForwardTerms:
    base: dict[str, object] = {
        "prompt": 1000,
        "output": 100,
        "per_token": 1e-3,
        "decode_per_token": 0.03,
        "reuse": 0.5,
        "home_uncached": 200,
        "step_s": 0.03,
    }
    base.update(changes)
    return ForwardTerms(**base)  # type: ignore[arg-type]


def test_a_forward_is_its_round_trip_estimate_prefill_decode_and_what_it_leaves() -> None:
    terms = _terms()
    eu = target("eu", extra={"rtt_ms": 80.0, "estimate_s": 0.5})
    choice = best_peer(terms, [eu], {})
    lost = 0.5 * (200 + 100) * 1e-3  # the later turns that will miss at home
    displaced = 0.5 * 1000 * 1e-3  # the peer's own tokens the cold copy displaces
    expected = 0.08 + 0.5 + 1000 * 1e-3 + 100 * 0.03 + 0.03 + lost + displaced
    assert choice.option is Option.PEER and choice.target is eu
    assert choice.cost_s == pytest.approx(expected)
    # Where the peer holds more of the prompt than home (its program lives there),
    # nothing is left behind and nothing is charged for displacing: the copy here
    # would be the larger one, and displace as much of this region's own.
    holds = best_peer(terms, [eu], {"eu": 100})
    assert holds.cost_s == pytest.approx(0.08 + 0.5 + 0.1 + 100 * 0.03 + 0.03)
    # Where it holds less than home, the tokens it lacks displace as many of its own.
    less = best_peer(terms, [eu], {"eu": 300})
    assert less.cost_s == pytest.approx(0.08 + 0.5 + 0.3 + 100 * 0.03 + 0.03 + lost + 0.15)
    # displace_weight 0 leaves it unpriced.
    unpriced = best_peer(_terms(displace_weight=0.0), [eu], {})
    assert unpriced.cost_s == pytest.approx(expected - displaced)


def test_equal_holdings_leave_nothing_behind_unless_neither_holds_any_of_the_prompt() -> None:
    eu = target("eu", extra={"rtt_ms": 80.0})

    def price(home: int, at_peer: int) -> float:
        terms = _terms(home_uncached=home)
        copied = 0.5 * at_peer * 1e-3 if at_peer >= home else 0.0  # displaced at the peer
        rest = 0.08 + at_peer * 1e-3 + 100 * 0.03 + 0.03 + copied
        return best_peer(terms, [eu], {"eu": at_peer}).cost_s - rest

    # Both hold the same 800 tokens (a system prompt, a tree's question): the
    # program's later requests follow the forward, so nothing is left behind.
    assert price(200, 200) == pytest.approx(0.0)
    # Neither holds any of it: maybe a document other sessions here send again.
    assert price(1000, 1000) == pytest.approx(0.5 * (1000 + 100) * 1e-3)
    # Home holds more: the later requests would find it here.
    assert price(200, 300) == pytest.approx(0.5 * (200 + 100) * 1e-3)
    # The peer holds more: nothing is left behind.
    assert price(1000, 300) == pytest.approx(0.0)


def test_a_peers_own_prices_replace_this_regions_weighted_by_reuse() -> None:
    terms = _terms(home_uncached=None)
    priced = target(
        "eu", extra={"rtt_ms": 80.0, "prefill_s_per_token": 3e-3, "decode_s_per_token": 0.05}
    )
    prefill = 1e-3 + 0.5 * (3e-3 - 1e-3)
    expected = 0.08 + 1000 * prefill + 100 * (0.5 * 0.05) + 0.03 + 0.5 * 1000 * prefill
    assert best_peer(terms, [priced], {}).cost_s == pytest.approx(expected)


def test_a_peer_whose_first_token_would_miss_the_slo_is_priced_a_miss_more() -> None:
    # Its own wait there: 80 ms round trip, 0.5 s of its queue, one step and the
    # 1,000 tokens it lacks at 1 ms: 1.61 s.  The rest of its price is no wait.
    eu = target("eu", extra={"rtt_ms": 80.0, "estimate_s": 0.5})

    def price(slo: float, queued_s: float = 0.0) -> float:
        terms = _terms(rate=1e-3, ttft_slo_s=slo, miss_s=7.0)
        return best_peer(terms, [eu], {}, {"eu": queued_s}).cost_s

    unpriced = price(0.0)  # no SLO: no miss
    assert price(1.62) == pytest.approx(unpriced)
    assert price(1.60) == pytest.approx(unpriced + 7.0)
    # A wait in its queue (a held-back peer the program lives in) is part of it.
    assert price(1.62, queued_s=0.1) == pytest.approx(price(0.0, queued_s=0.1) + 7.0)


def test_equal_peers_go_to_the_lower_id_and_an_unknown_round_trip_is_never_cheapest() -> None:
    terms = _terms()
    b, a = target("b", extra={"rtt_ms": 80.0}), target("a", extra={"rtt_ms": 80.0})
    assert best_peer(terms, [b, a], {}).target is a
    unknown = target("0", extra={})
    assert best_peer(terms, [unknown, b], {}).target is b
