"""Block identity end to end: emulated replicas with 32-token blocks and vLLM's hash,
one balancer, one ``cache_map`` service per block-identity mode.

The balancer learns the block size from the replicas' ``vllm:cache_config_info``,
keys requests under each model's scheme, and keys the replicas' KV events the same
way (``token_ids``: rebuilt from the events' token ids; ``vllm``: the engine's own
hashes), so a prefix a replica cached behind the balancer's back draws the next
requests to that replica, whichever of the two it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ops import http_probe
from tests.support.balancers import TopologyFactory, start_balancer, start_replicas, state
from tests.support.polling import eventually
from tests.support.processes import ProcessGroup, free_port, free_port_run

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

MODES = {"token_ids": "bi-token-ids", "vllm": "bi-vllm"}  # mode -> model


@dataclass(frozen=True)
class Lab:
    url: str
    key: str
    replicas: dict[str, dict[str, str]]  # model -> replica name -> url

    def complete(self, model: str, prompt: str) -> httpx.Response:
        response = http_probe.post(
            f"{self.url}/v1/completions",
            json={"model": model, "prompt": prompt, "max_tokens": 1},
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=30,
        )
        response.raise_for_status()
        return response

    def direct(self, model: str, replica: str, prompt: str) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": 1}
        http_probe.post(f"{self.replicas[model][replica]}/v1/completions", json=body, timeout=30)

    def wait_applied(self, model: str, replica: str) -> None:
        url = self.replicas[model][replica]
        sequence = int(http_probe.get(f"{url}/kv_cache/blocks", timeout=5).json()["sequence"])

        def applied() -> bool:
            row = state(self.url)["kv_events"]["replicas"].get(replica) or {}
            return (row.get("next_sequence") or 0) >= sequence and row.get("pending") == 0

        eventually(applied, what=f"{replica}'s events through {sequence} applied")


def prompt(tag: str) -> str:
    return f"{tag} " + " ".join(f"w{i}" for i in range(160))  # five full 32-token blocks


def model_row(lab: Lab, model: str) -> dict[str, Any]:
    return next(m for m in state(lab.url)["models"] if m["model"] == model)


@pytest.fixture(scope="module")
def lab(
    topology: TopologyFactory, child_env: dict[str, str], module_processes: ProcessGroup
) -> Iterator[Lab]:
    region = topology.region("bi-lab")
    lb_port = free_port()
    topology.balancer("bi-lab-lb", region, lb_port)
    replicas: dict[str, dict[str, str]] = {}
    for mode, model in MODES.items():
        ports = {f"{mode}-{i}": free_port() for i in (1, 2)}
        for name, port in ports.items():
            topology.replica(name, region, port, model=model)
        kv_base = str(free_port_run(len(ports)))
        extra = ("--kv-events-port-base", kv_base, "--block-size", "32")
        start_replicas(module_processes, f"bi-{mode}", ports, *extra, model=model)
        params = {"pushing": "blind", "block_identity": {"mode": mode}}
        topology.service(model, policy="cache_map", policy_params=params)
        replicas[model] = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    key = topology.api_key()
    env = {**child_env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    url = start_balancer(module_processes, env, "bi-lab-lb", lb_port)
    names = {n for by_name in replicas.values() for n in by_name}

    def ready() -> bool:
        now = state(url)
        engine_sized = all(
            m["block_identity"]["block_size_source"] == "engine" for m in now["models"]
        )
        subscribed = names <= set(now["kv_events"]["replicas"])
        return engine_sized and subscribed and all(r["healthy"] for r in now["replicas"])

    eventually(ready, what="block sizes read from the engines and KV events subscribed")
    built = Lab(url, key, replicas)
    # ZMQ subscriptions propagate asynchronously: publish until every stream is heard.
    for attempt in range(50):
        for model, by_name in replicas.items():
            for name in by_name:
                built.direct(model, name, prompt(f"warm-{name}-{attempt}"))
        rows = state(url)["kv_events"]["replicas"]
        if all(rows[n]["received"] > 0 for n in names):
            break
    yield built


@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_model_uses_the_engines_block_size_and_its_mode(lab: Lab, mode: str) -> None:
    row = model_row(lab, MODES[mode])["block_identity"]
    assert (row["mode"], row["block_size"], row["block_size_source"]) == (mode, 32, "engine")


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_prefix_cached_behind_the_balancers_back_draws_requests_to_its_holder(
    lab: Lab, mode: str
) -> None:
    model = MODES[mode]
    for holder in sorted(lab.replicas[model]):  # each replica in turn: no lucky tie-break
        shared = prompt(f"{mode}-held-by-{holder}")
        lab.direct(model, holder, shared)
        lab.wait_applied(model, holder)
        answers = [lab.complete(model, shared) for _ in range(3)]
        assert [a.headers["X-Meridian-Replica"] for a in answers] == [holder] * 3
        # The engine agrees: 160 of the prompt's tokens were served from its cache.
        assert answers[0].json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 160
    assert state(lab.url)["kv_events"]["orphans"] == 0
