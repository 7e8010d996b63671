"""Block identity against the real engine (issue 12, item 2): the keys Meridian gives a
request's blocks must be the keys under which the engine's KV events name them.

In ``vllm`` mode Meridian computes vLLM's own hash (sha256 chained from the none-hash that
``PYTHONHASHSEED`` seeds, LoRA adapters as extra keys, the low 64 bits as in the events);
the oracle is the hash vLLM itself published for the same tokens. The default
``token_ids`` mode is proven where it matters, by routing: ``test_vllm_conformance``'s
steering, eviction and adapter tests run on a service with no ``block_identity`` set.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from core.block_identity import BlockIdentityMode, BlockScheme, VllmHashSpec
from core.kv_events import STORED
from tests.engines.conftest import ADAPTER, BLOCK_SIZE, HASH_SEED
from tests.engines.fleet import EngineFleet, event_tap, prompt_blocks_only, settle

pytestmark = [pytest.mark.engines, pytest.mark.django_db, pytest.mark.timeout(1200)]


def stored_hashes(fleet: EngineFleet, replica: str, model: str, prompt: str) -> list[int]:
    """The block hashes ``replica`` publishes for ``prompt`` (new to it) under ``model``."""
    with event_tap(fleet.replicas[replica]) as tap:
        settle(tap, fleet, replica)
        fleet.direct_client(replica).completions.create(model=model, prompt=prompt, max_tokens=1)
        events = [e for m in tap.drain(wait_s=10) for e in m.events if e["type"] == STORED]
    return [h for e in events for h in e["block_hashes"]]


@pytest.mark.parametrize("adapter", ["", ADAPTER], ids=["base-model", "lora-adapter"])
def test_vllm_mode_keys_are_the_engines_event_hashes(
    fleet: EngineFleet, lora_dir: Path, adapter: str
) -> None:
    prompt = prompt_blocks_only(fleet, 150, BLOCK_SIZE)
    ids = fleet.prompt_ids(prompt)
    published = stored_hashes(fleet, "vllm-b", adapter or fleet.model, prompt)
    assert len(published) == len(ids) // BLOCK_SIZE

    def scheme(seed: str) -> BlockScheme:
        return BlockScheme(
            mode=BlockIdentityMode.VLLM,
            block_size=BLOCK_SIZE,
            vllm=VllmHashSpec(seed=seed),
            lora_paths={ADAPTER: str(lora_dir)},
        )

    assert scheme(HASH_SEED).keys(ids, adapter) == published
    # The seed is the whole difference between replicas that share blocks and ones that
    # do not: a wrong one matches nothing.
    assert set(scheme("0").keys(ids, adapter)).isdisjoint(published)
