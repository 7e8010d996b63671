"""The emulated inference engine: a pure, step-driven model of vLLM V1.

``Engine`` owns a block pool with prefix caching (``block_pool``), a
continuous-batching scheduler with chunked prefill and preemption (``engine``),
a step-time model per GPU/model profile (``profiles``), vLLM-style counters
(``stats``) and KV cache events (``events``).  It never sleeps or does I/O, so
the same object runs behind the HTTP replica and inside the discrete-event
simulator.
"""

from __future__ import annotations

from sim.engine.engine import Engine, EngineConfig, RequestOutput, StepResult
from sim.engine.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from sim.engine.profiles import PROFILES, StepTimeProfile, get_profile
from sim.engine.request import EngineRequest, FinishReason, OutputLengthModel
from sim.engine.vocab import Vocabulary

__all__ = [
    "PROFILES",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Engine",
    "EngineConfig",
    "EngineRequest",
    "FinishReason",
    "KVEvent",
    "OutputLengthModel",
    "RequestOutput",
    "StepResult",
    "StepTimeProfile",
    "Vocabulary",
    "get_profile",
]
