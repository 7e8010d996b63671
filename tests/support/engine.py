"""Requests for the emulated engine driven in-process, step by step."""

from __future__ import annotations

import itertools

from sim.engine import Engine, EngineRequest, StepResult

_token_counter = itertools.count(10_000)


def fresh_prompt(length: int) -> list[int]:
    """Token ids no other prompt in the session shares (so nothing is cached by accident)."""
    return [next(_token_counter) for _ in range(length)]


def request(
    request_id: str, prompt: list[int], max_tokens: int = 16, **kw: object
) -> EngineRequest:
    return EngineRequest(request_id, list(prompt), max_tokens, **kw)  # type: ignore[arg-type]


def run_to_completion(engine: Engine, max_steps: int = 10_000) -> list[StepResult]:
    results = []
    while engine.has_work():
        results.append(engine.step())
        assert len(results) < max_steps, "engine made no progress"
    return results
