"""The ``zero`` step-time profile: no modeled compute, the same scheduling and cache.

``manage.py bench proxy`` runs its backends on this profile so that the balancer
is what is measured; the replica must still behave like a vLLM server.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx

from sim.engine import Engine, get_profile
from tests.support.engine import fresh_prompt, request, run_to_completion
from tests.support.processes import ProcessGroup
from tests.support.sim_serve import start_replicas


def test_zero_profile_steps_cost_nothing_whatever_the_batch() -> None:
    zero = get_profile("zero")
    assert zero.step_seconds(512, 0, 0) == 0.0
    assert zero.step_seconds(2048, 64, 100_000) == 0.0


def test_zero_engine_generates_every_token_and_still_caches_prefixes(
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(profile="zero")
    prompt = fresh_prompt(100)
    engine.add_request(request("first", prompt, 32, ignore_eos=True))
    first = run_to_completion(engine)
    assert engine.clock == 0.0  # no step advanced the modeled clock
    assert sum(len(out.new_token_ids) for step in first for out in step.outputs) == 32

    engine.add_request(request("again", prompt, 8, ignore_eos=True))
    last = run_to_completion(engine)[-1].outputs[-1]
    assert last.completion_tokens == 8
    assert last.cached_tokens == 96  # six full 16-token blocks of the shared prompt


def test_zero_replica_streams_the_requested_tokens(processes: ProcessGroup) -> None:
    served = start_replicas(processes, ["z"], "--profile", "zero")
    body = {
        "model": "meridian-demo",
        "messages": [{"role": "user", "content": "hello " * 200}],
        "max_tokens": 64,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    url = served.urls["z"] + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=10) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 64
    assert usage["prompt_tokens"] > 200
