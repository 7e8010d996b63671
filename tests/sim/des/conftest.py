"""Small simulated deployments for the simulator's tests (no database, no settings)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from sim.des.config import SimConfig, TimingConfig

# Short conversations: small prompts and replies keep each run a fraction of a second.
SHORT_CHAT = (
    "conversations:system_tokens=128,users=8,turns_min=1,turns_max=3,"
    "user_tokens_min=16,user_tokens_max=48,max_tokens_min=8,max_tokens_max=24"
)
SINGLE_TURN = (
    "system-prompts:system_tokens=64,question_tokens_min=8,question_tokens_max=16,"
    "max_tokens_min=16,max_tokens_max=16"
)


@pytest.fixture
def make_config() -> Callable[..., SimConfig]:
    """``make_config(policy="skylb", replicas={...}, timing={...}, ...)``."""

    def make(**overrides: Any) -> SimConfig:
        timing = dataclasses.replace(TimingConfig(), **overrides.pop("timing", {}))
        values: dict[str, Any] = {
            "workload": SHORT_CHAT,
            "policy": "skylb",
            "replicas": {"us-east": 2, "eu-west": 1},
            "clients": {"us-east": 3, "eu-west": 2},
            "max_requests": 30,
            "seed": 3,
            "timing": timing,
        }
        values.update(overrides)
        return SimConfig(**values)

    return make
