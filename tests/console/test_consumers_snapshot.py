"""The live snapshot's aggregation (console.live.snapshot), without a stack."""

from __future__ import annotations

from typing import Any

from console.live.snapshot import BalancerRow, ReplicaRow, TickInputs, build_snapshot


def state(requests: int, prompt: int, cached: int, **extra: Any) -> dict[str, Any]:
    row = {"name": "us-r1", "requests": requests, "prompt_tokens": prompt, "cached_tokens": cached}
    return {
        "inflight": 2,
        "queue": 1,
        "queues": [{"oldest_wait_s": 0.4}],
        "replicas": [{**row, "waiting": 3}],
        **extra,
    }


def inputs(now: float, st: dict[str, Any] | None, previous: dict[str, Any]) -> TickInputs:
    return TickInputs(
        now=now,
        regions=[("us", "US"), ("eu", "")],
        balancers=[
            BalancerRow("us-lb", "us", "http://127.0.0.1:1", "up"),
            BalancerRow("eu-lb", "eu", "http://127.0.0.1:2", "up"),
        ],
        replicas=[
            ReplicaRow("us-r1", "us", "us-1", "spot", "ready", None),
            ReplicaRow("us-r2", "us", "us-1", "reserved", "preempted", None),
        ],
        states={"us-lb": st, "eu-lb": None},
        heartbeats={"us-lb": now - 1, "eu-lb": now - 60},
        rollups={
            "us": {
                "requests": 10,
                "forwarded_out": 4,
                "forwarded_in": 1,
                "ttft_p50_s": 0.1,
                "ttft_p90_s": 0.3,
            },
            "eu": None,
        },
        previous=previous,
        hourly_cost={"us": 1.5},
    )


def test_rates_and_hit_rate_come_from_counter_growth_between_ticks() -> None:
    first, totals = build_snapshot(inputs(100.0, state(10, 1000, 200), {}))
    assert first["regions"][0]["rps"] is None  # nothing to difference yet
    second, _ = build_snapshot(inputs(102.0, state(16, 1400, 500), totals))
    us, eu = second["regions"]
    assert us["rps"] == 3.0
    assert us["hit_rate"] == 0.75  # 300 cached of 400 new prompt tokens
    assert (us["inflight"], us["queue"], us["waiting"], us["oldest_wait_s"]) == (2, 1, 3, 0.4)
    assert us["by_kind"] == {"reserved": [0, 1], "spot": [1, 1]}
    assert us["local_share"] == 0.6 and us["ttft_p90_s"] == 0.3
    assert us["balancer_up"] and not eu["balancer_up"]  # eu: stale heartbeat, no answer
    assert (us["hourly_cost"], eu["hourly_cost"]) == (1.5, 0.0)  # workers.cost's billed rate


def test_a_restarted_balancer_counts_from_zero_not_negative() -> None:
    _, totals = build_snapshot(inputs(100.0, state(50, 5000, 100), {}))
    after, _ = build_snapshot(inputs(101.0, state(2, 100, 50), totals))
    assert after["regions"][0]["rps"] == 2.0
    assert after["regions"][0]["hit_rate"] == 0.5


def test_replica_rows_carry_db_state_and_live_numbers() -> None:
    snap, _ = build_snapshot(inputs(100.0, state(1, 10, 5), {}))
    rows = {r["name"]: r for r in snap["replicas"]}
    assert rows["us-r1"]["waiting"] == 3 and rows["us-r1"]["reported_by"] == "us-lb"
    assert rows["us-r2"]["state"] == "preempted" and rows["us-r2"]["waiting"] is None


def test_replica_rows_carry_the_balancers_cache_warnings() -> None:
    warning = {"kind": "kv_stream_silent", "message": "no KV event has arrived"}
    st = state(1, 10, 5)
    st["replicas"][0]["warnings"] = [warning]
    snap, _ = build_snapshot(inputs(100.0, st, {}))
    rows = {r["name"]: r for r in snap["replicas"]}
    assert rows["us-r1"]["warnings"] == [warning]
    assert rows["us-r2"]["warnings"] == []  # no balancer reports it: nothing to warn of


def test_replica_rows_carry_the_anticipated_kv_peak_and_a_coarse_curve() -> None:
    st = state(1, 10, 5)
    ahead = [500 - i for i in range(100)]
    st["replicas"][0]["forecast"] = {"peak_kv_tokens": 500, "lookahead": ahead}
    snap, _ = build_snapshot(inputs(100.0, st, {}))
    rows = {r["name"]: r for r in snap["replicas"]}
    assert rows["us-r1"]["anticipated_peak"] == 500
    assert rows["us-r1"]["lookahead"] == ahead[::5]  # 20 points of the 100
    assert rows["us-r2"]["anticipated_peak"] is None and rows["us-r2"]["lookahead"] == []
