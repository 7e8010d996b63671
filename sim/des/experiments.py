"""SkyLB §5's experiments as ready-made plans (``manage.py simulate --experiment``).

Parameters are chosen once, here, and documented in ``docs/results.md``; none
is tuned to make one figure come out.  Every plan uses the L4 / Llama-3.1-8B
engine profile (the paper's hardware), the production balancer timing, the
demo's RTTs (us↔eu 80 ms, us↔ap 150 ms, eu↔ap 200 ms) and closed-loop clients
that each run one program at a time (§5.1).

* ``fig8-conversations``/``fig8-tot``/``fig8-mixed``: RR, LL, CH, SGLang (one
  balancer in us-east, blind pushing, as the paper's baselines) against
  SkyLB-CH and SkyLB (a balancer per region, SP-P) on 12 replicas, 4 per region;
  conversations with 80 clients per region (ChatBot Arena's setting), ToT
  (branching 2, depth 4) and mixed ToT (branching 2 and 4) with 40/20/20 clients.
* ``fig9``: SGLang's policy with blind pushing, SP-O and SP-P on 4 replicas and
  30 clients in one region, ToT branching 2.  SP-O's cap is 20 outstanding
  requests per replica: the paper does not give its value, and §3.3 reports
  that 20 to 50 outstanding requests fit one L4 depending on the data, so the
  cap is the low end of that range (a cap safe for long requests).
* ``fig10``: SkyLB with forwarding (``regional``) against the same balancers
  without it (``local``), clients skewed 120/40/40, replicas 3, 6, 9 and 12
  spread evenly, multi-turn conversations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sim.des.config import SimConfig, SimConfigError, TimingConfig
from sim.des.plan import RunPlan

REGIONS = ("us-east", "eu-west", "ap-southeast")
FIG8_POLICIES = (
    ("RR", "round_robin"),
    ("LL", "least_load"),
    ("CH", "consistent_hash"),
    ("SGL", "sglang"),
    ("SkyLB-CH", "skylb_ch"),
    ("SkyLB", "skylb"),
)
SP_O_CAP = 20
DEFAULT_DURATION_S = 600.0


def _even(total: int) -> dict[str, int]:
    return {r: total // len(REGIONS) + (i < total % len(REGIONS)) for i, r in enumerate(REGIONS)}


def _fig8(workload: str, clients: dict[str, int], duration: float, seed: int) -> RunPlan:
    base = SimConfig(
        workload=workload,
        policy="least_load",
        replicas=_even(12),
        clients=clients,
        duration_s=duration,
        seed=seed,
    )
    runs = [(label, dataclasses.replace(base, policy=name)) for label, name in FIG8_POLICIES]
    return RunPlan(f"Figure 8: {workload}, 12 replicas in 3 regions", runs)


def fig8_conversations(duration: float, seed: int) -> RunPlan:
    return _fig8("conversations", dict.fromkeys(REGIONS, 80), duration, seed)


def fig8_tot(duration: float, seed: int) -> RunPlan:
    clients = {"us-east": 40, "eu-west": 20, "ap-southeast": 20}
    return _fig8("tot:branching=2,depth=4", clients, duration, seed)


def fig8_mixed(duration: float, seed: int) -> RunPlan:
    clients = {"us-east": 40, "eu-west": 20, "ap-southeast": 20}
    return _fig8("tot:branching=2,depth=4+tot:branching=4,depth=4", clients, duration, seed)


def fig9(duration: float, seed: int) -> RunPlan:
    base = SimConfig(
        workload="tot:branching=2,depth=4",
        policy="sglang",
        replicas={"us-east": 4},
        clients={"us-east": 30},
        duration_s=duration,
        seed=seed,
        timing=dataclasses.replace(TimingConfig(), max_outstanding=SP_O_CAP),
    )
    runs = [
        (label, dataclasses.replace(base, pushing=mode))
        for label, mode in (("BP", "blind"), ("SP-O", "sp-o"), ("SP-P", "sp-p"))
    ]
    return RunPlan("Figure 9: selective pushing, 4 replicas, 30 clients, ToT", runs)


def fig10(duration: float, seed: int) -> RunPlan:
    runs = []
    for total in (3, 6, 9, 12):
        for label, deployment in (("region-local", "local"), ("SkyLB", "regional")):
            config = SimConfig(
                workload="conversations",
                policy="skylb",
                replicas=_even(total),
                clients={"us-east": 120, "eu-west": 40, "ap-southeast": 40},
                deployment=deployment,
                duration_s=duration,
                seed=seed,
            )
            runs.append((f"{label} {total}", config))
    return RunPlan("Figure 10: cross-region vs region-local, skewed clients", runs)


EXPERIMENTS: dict[str, Callable[[float, int], RunPlan]] = {
    "fig8-conversations": fig8_conversations,
    "fig8-tot": fig8_tot,
    "fig8-mixed": fig8_mixed,
    "fig9": fig9,
    "fig10": fig10,
}


def experiment(name: str, duration: float | None, seed: int) -> RunPlan:
    try:
        build = EXPERIMENTS[name]
    except KeyError:
        raise SimConfigError(
            f"unknown experiment {name!r}; choose one of: {', '.join(EXPERIMENTS)}"
        ) from None
    return build(duration or DEFAULT_DURATION_S, seed)
