"""LoRA affinity end to end: two emulated replicas that each hold one adapter at a time
(``--max-loras 1``), a real balancer with no adapter configuration at all.

The balancer learns the adapters from the replicas' ``/v1/models`` (vLLM lists each
adapter with the base model as ``parent``) and their use from
``vllm:lora_requests_info``.  With adapter ``sql`` running on one replica, requests
for ``sql`` stay there (no adapter load) and requests for ``chat`` go to the other
(the first has no room without evicting ``sql``), under ``round_robin``, which would
otherwise alternate.  Claims are about where requests go (``X-Meridian-Replica``),
waited for with bounded polling, never about times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from ops import http_probe
from tests.support.balancers import TopologyFactory, start_balancer, start_replicas, state
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MODEL = "meridian-lora-base"
NAMES = ("lo-a", "lo-b")
ADAPTERS = ("sql", "chat")


@dataclass(frozen=True)
class Lab:
    url: str
    key: str
    replicas: dict[str, str]  # name -> url

    def served_by(self, model: str) -> str:
        """The replica the balancer sent a one-token request for ``model`` to."""
        response = http_probe.post(
            f"{self.url}/v1/completions",
            json={"model": model, "prompt": "select the rows", "max_tokens": 1},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )
        response.raise_for_status()
        return response.headers["X-Meridian-Replica"]

    def lora_of(self, replica: str) -> dict[str, object] | None:
        row = next(r for r in state(self.url)["replicas"] if r["name"] == replica)
        lora: dict[str, object] | None = row["lora"]
        return lora


@pytest.fixture(scope="module")
def lab(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Lab]:
    region = topology.region("lora-lab")
    ports = {name: free_port() for name in NAMES}
    for name, port in ports.items():
        topology.replica(name, region, port, model=MODEL)
    # Real time (--time-scale 1): the request holding an adapter stays running while
    # the test routes around it.
    start_replicas(
        module_processes, "lora", ports, "--lora", ADAPTERS[0], "--lora", ADAPTERS[1],
        "--max-loras", "1", "--time-scale", "1", model=MODEL,
    )  # fmt: skip
    topology.service(MODEL, policy="round_robin", policy_params={"pushing": "blind"})
    key = topology.api_key()
    port = free_port()
    topology.balancer("lora-lb", region, port)
    env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    url = start_balancer(module_processes, env, "lora-lb", port)
    yield Lab(url, key, {n: f"http://127.0.0.1:{p}" for n, p in ports.items()})


def wait_learned(lab: Lab) -> None:
    def learned() -> bool:
        row = next(m for m in state(lab.url)["models"] if m["model"] == MODEL)
        return bool(row["lora_adapters"] == sorted(ADAPTERS))

    eventually(learned, what="the balancer learned both adapters from /v1/models")


def test_adapters_are_learned_from_the_replicas_model_lists(lab: Lab) -> None:
    wait_learned(lab)
    assert lab.served_by("sql") in NAMES  # an adapter name now routes to its base model


def test_an_adapter_stays_where_it_is_active_and_another_goes_where_there_is_room(
    lab: Lab,
) -> None:
    wait_learned(lab)
    holder, other = NAMES
    body = {"model": "sql", "prompt": "a long report", "max_tokens": 4000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    # A long request for "sql" straight to the holder keeps the adapter running there.
    with httpx.stream(
        "POST", f"{lab.replicas[holder]}/v1/completions", json=body, timeout=60
    ) as held:
        lines = held.iter_lines()  # kept: a dropped iterator would close the stream
        next(lines)  # the first chunk: the request is running

        def sql_running_on_holder() -> bool:
            lora = lab.lora_of(holder)
            return lora is not None and lora["running"] == ["sql"] and lora["max_lora"] == 1

        eventually(sql_running_on_holder, what="the probe saw sql running on the holder")
        assert [lab.served_by("sql") for _ in range(4)] == [holder] * 4
        assert [lab.served_by("chat") for _ in range(4)] == [other] * 4
