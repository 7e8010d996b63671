"""The balancer's topology snapshot as read from the rows: replicas and peers with the
round trip from this balancer's region."""

from __future__ import annotations

import math

import pytest

from routing.topology import load_snapshot
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
