"""The balancer's topology snapshot as read from the rows: replicas and peers with the
round trip from this balancer's region."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from fleet.models import ApiKey, Replica
from routing.topology import load_snapshot, refresh_snapshot
from tests.support.rows import Rows


@pytest.mark.django_db
def test_replicas_owned_across_regions_carry_that_regions_round_trip() -> None:
    rows = Rows()
    us, eu, ap = rows.region("us-east"), rows.region("eu-west"), rows.region("ap-southeast")
    rows.rtt(us, eu, 80.0)
    us_lb = rows.balancer("us-lb", us)
    rows.balancer("eu-lb", eu)
    rows.replica("us-r1", us)
    # Failover handed these to us-east's balancer; no latency row to ap-southeast.
    rows.replica("eu-r1", eu, balancer=us_lb)
    rows.replica("ap-r1", ap, balancer=us_lb)
    snapshot = load_snapshot("us-lb")
    rtt = {r.name: r.rtt_ms for r in snapshot.replicas}
    # A replica of an unmeasured region is priced as a local one, as before.
    assert rtt == {"us-r1": 0.0, "eu-r1": 80.0, "ap-r1": 0.0}
    assert [(p.name, p.rtt_ms) for p in snapshot.peers] == [("eu-lb", 80.0)]
    assert not any(math.isinf(r.rtt_ms) for r in snapshot.replicas)


@pytest.mark.django_db
def test_a_refresh_reads_one_row_while_nothing_changed_and_everything_once_it_did(
    django_assert_num_queries: Any,
) -> None:
    rows = Rows()
    us = rows.region("us-east")
    rows.balancer("us-lb", us)
    rows.replica("us-r1", us)
    first = load_snapshot("us-lb")
    with django_assert_num_queries(1):
        same, in_full = refresh_snapshot("us-lb", first, full=False)
    assert not in_full
    assert same.loaded_at >= first.loaded_at
    assert dataclasses.replace(same, loaded_at=first.loaded_at) == first

    ApiKey.issue("team")  # a save: the token moves
    fresh, in_full = refresh_snapshot("us-lb", same, full=False)
    assert in_full
    assert len(fresh.api_key_hashes) == 1
    assert fresh.change_token != first.change_token


@pytest.mark.django_db
def test_a_write_that_bypassed_the_token_is_read_by_the_periodic_full_refresh() -> None:
    rows = Rows()
    us = rows.region("us-east")
    rows.balancer("us-lb", us)
    rows.replica("us-r1", us)
    first = load_snapshot("us-lb")
    Replica.objects.filter(name="us-r1").update(state=Replica.State.DRAINING)  # no signal
    stale, _ = refresh_snapshot("us-lb", first, full=False)
    assert [r.name for r in stale.replicas] == ["us-r1"]
    fresh, in_full = refresh_snapshot("us-lb", stale, full=True)
    assert in_full and fresh.replicas == ()
