"""A run's token waits: the inter-token latency by term, and had batches been even."""

from __future__ import annotations

import pytest

from sim.des.metrics import even_share, token_waits
from sim.engine.stats import TokenWaits


def test_even_batches_leave_nothing_to_even_out() -> None:
    assert even_share([(4, 4, 4), (2, 2, 2)]) == 1.0
    assert even_share([]) == 1.0
    assert even_share([(0, 0)]) == 1.0  # nothing ran


def test_uneven_batches_at_one_instant_shrink_when_spread() -> None:
    # 3 and 1 running: a request sits in a batch of (9 + 1) / 4 = 2.5 on average;
    # spread evenly, 2 on each, it sits in a batch of 2.
    assert even_share([(3, 1)]) == pytest.approx(2 / 2.5)


def test_the_fleet_s_total_moving_over_time_is_not_placement() -> None:
    # Even at every instant, though the fleet ran 2 at one and 8 at the next: a
    # request sat in a larger batch than the time average, and no placement helps.
    assert even_share([(1, 1), (4, 4)]) == 1.0


def test_evening_within_regions_leaves_the_imbalance_between_them() -> None:
    # Two regions of two replicas: one runs 4 and 4, the other 1 and 1.  Within each
    # region they are even already; only moving requests between regions evens them.
    batches = [(4, 4, 1, 1)]
    assert even_share(batches, [[0, 1], [2, 3]]) == 1.0
    assert even_share(batches) == pytest.approx(4 * 2.5**2 / (16 + 16 + 1 + 1))
    # Uneven inside one region: evening it there helps, and all of it helps more.
    uneven = [(6, 2, 1, 1)]
    inside = even_share(uneven, [[0, 1], [2, 3]])
    assert inside == pytest.approx((2 * 4**2 + 2 * 1**2) / (36 + 4 + 1 + 1))
    assert even_share(uneven) < inside < 1.0


def test_the_latency_splits_by_term_and_prices_the_batch_at_its_even_share() -> None:
    waits = TokenWaits()
    waits.add_step((0.030, 0.010, 0.020), batch=4, tokens=4)
    waits.add_step((0.030, 0.000, 0.010), batch=2, tokens=2)
    figures = token_waits(waits, [(3, 1)], ("us-east", "eu-west"))
    assert figures["fixed_ms"] == pytest.approx(30.0)
    assert figures["prefill_ms"] == pytest.approx(1000 * 4 * 0.010 / 6)
    assert figures["batch_ms"] == pytest.approx(1000 * (4 * 0.020 + 2 * 0.010) / 6)
    assert figures["itl_ms"] == pytest.approx(
        figures["fixed_ms"] + figures["prefill_ms"] + figures["batch_ms"]
    )
    assert figures["token_batch"] == pytest.approx((16 + 4) / 6)
    assert figures["even_share"] == pytest.approx(0.8)
    assert figures["even_itl_ms"] == pytest.approx(
        figures["fixed_ms"] + figures["prefill_ms"] + 0.8 * figures["batch_ms"]
    )
    # One replica per region: nothing to even out without moving between regions.
    assert figures["region_share"] == 1.0
    assert figures["region_itl_ms"] == pytest.approx(figures["itl_ms"])
    same_region = token_waits(waits, [(3, 1)], ("us-east", "us-east"))
    assert same_region["region_share"] == pytest.approx(0.8)


def test_a_run_that_sampled_no_token_has_no_figures() -> None:
    assert token_waits(TokenWaits(), [(1, 1)]) == {}
