"""The live snapshot's layout (console.live.snapshot) from balancers' records, no stack."""

from __future__ import annotations

from console.live.snapshot import BalancerRow, FeedInputs, ReplicaRow, build_snapshot, history
from core.live_feed import Counters, LiveRecord, ReplicaLive

NOW = 1000.0


def record(balancer: str, region: str, ts: float, **kw: object) -> LiveRecord:
    delta = Counters(requests=4, prompt_tokens=100, cached_tokens=75)
    return LiveRecord(balancer, region, ts, 1.0, delta, queue=1, waiting=2, **kw)  # type: ignore[arg-type]


def inputs(records: dict[str, list[LiveRecord]]) -> FeedInputs:
    return FeedInputs(
        now=NOW,
        regions=[("us", "US"), ("eu", "")],
        balancers=[
            BalancerRow("us-lb", "us", "http://127.0.0.1:1", "up"),
            BalancerRow("eu-lb", "eu", "http://127.0.0.1:2", "up"),
        ],
        replicas=[
            ReplicaRow("us-r1", "us", "us-1", "spot", "ready", "us-lb"),
            ReplicaRow("us-r2", "us", "us-1", "reserved", "preempted", None),
        ],
        records=records,
        hourly_cost={"us": 1.5},
    )


def test_regions_read_rates_from_records_and_say_since_when_quiet() -> None:
    snapshot = build_snapshot(
        inputs({"us": [record("us-lb", "us", NOW - 1)], "eu": [record("eu-lb", "eu", NOW - 60)]})
    )
    us, eu = snapshot["regions"]
    assert (us["display_name"], us["rps"], us["hit_rate"]) == ("US", 4.0, 0.75)
    assert (us["queue"], us["waiting"], us["ready"], us["total"]) == (1, 2, 1, 2)
    assert us["by_kind"] == {"spot": [1, 1], "reserved": [0, 1]}
    assert us["balancer_up"] and us["hourly_cost"] == 1.5
    # Quiet for a minute: no numbers, not zeros, and since when.
    assert (eu["display_name"], eu["rps"], eu["hit_rate"], eu["last_ts"]) == (
        "eu",
        None,
        None,
        NOW - 60,
    )
    assert not eu["balancer_up"] and eu["balancers"][0]["last_ts"] == NOW - 60


def test_replicas_take_the_newest_reporting_balancers_row() -> None:
    old = ReplicaLive("us-r1", True, 1, 0, 1, 0.1, 0.2)
    new = ReplicaLive(
        "us-r1", True, 3, 2, 5, 0.4, 0.5, 900, (1, 2), ({"kind": "k", "message": "m"},)
    )
    records = {
        "us": [
            record("us-lb", "us", NOW - 2, replicas=(old,)),
            record("us-lb", "us", NOW - 1, replicas=(new,)),
        ]
    }
    r1, r2 = build_snapshot(inputs(records))["replicas"]
    assert (r1["running"], r1["waiting"], r1["kv_usage"], r1["hit_rate"]) == (3, 2, 0.4, 0.5)
    assert (r1["reported_by"], r1["anticipated_peak"], r1["lookahead"]) == ("us-lb", 900, [1, 2])
    assert r1["warnings"] == [{"kind": "k", "message": "m"}]
    assert r2["running"] is None and r2["state"] == "preempted"


def test_history_has_every_region_even_without_records() -> None:
    out = history(["us", "eu"], {"us": [record("us-lb", "us", NOW - 3)]}, step_s=5.0)
    assert out["us"]["rps"] == [4.0] and out["eu"]["t"] == []
