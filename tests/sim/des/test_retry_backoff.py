"""The simulator honours the dispatch core's retry backoff, in virtual time.

A region with no replica of its own forwards; the first peer refuses (503), the
core places the retry on the second peer at once with a jittered delay, and the
second peer must see the request that delay later (plus the hops).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from core.availability import PushingConfig, PushingMode
from core.topology import ModelSpec, PeerSpec
from core.types import RequestDescriptor
from sim.des.balancer import SimBalancer
from sim.des.calls import Journey, SimCall
from sim.des.config import TimingConfig
from sim.des.loop import EventLoop
from tests.support.inprocess import peer_report
from tests.support.sim_network import ONE_WAY_S, RefusingPeer, ScriptedNetwork
from tests.support.upstreams import MODEL

SPEC = ModelSpec(MODEL, pushing=PushingConfig(PushingMode.SP_O))
PEERS = [PeerSpec("near", "http://near", "eu", 80.0), PeerSpec("far", "http://far", "ap", 150.0)]


@dataclass
class TimedPeer(RefusingPeer):
    """Refuses every forward, noting when each arrived."""

    loop: EventLoop | None = None
    arrived_at: list[float] = field(default_factory=list)

    def submit(self, call: SimCall) -> None:
        assert self.loop is not None
        self.arrived_at.append(self.loop.now)
        super().submit(call)


def test_a_retry_reaches_the_next_target_after_its_backoff() -> None:
    peers = {"near": TimedPeer("eu"), "far": TimedPeer("ap")}
    net = ScriptedNetwork([], dict(peers))
    for peer in peers.values():
        peer.loop = net.loop
    lb = SimBalancer("lb-us", "us", net, TimingConfig(retry_backoff_s=1, retry_backoff_max_s=1))
    lb.adopt([], PEERS, {MODEL: SPEC})
    for name in peers:
        lb.remote.record_report(name, peer_report(name))
    call = SimCall(
        RequestDescriptor("r1", MODEL, prompt_tokens=3),
        [1, 2, 3],
        1,
        False,
        Journey(),
        on_first=lambda: None,
        on_done=lambda result: None,
    )
    lb.submit(call)
    net.loop.run(until=10.0)
    arrivals = sorted(t for peer in peers.values() for t in peer.arrived_at)
    assert len(arrivals) == 2
    # The core's default source is seeded: its first draw is the first retry's fraction.
    delay = random.Random(0).random() * 1.0
    gap = arrivals[1] - arrivals[0]
    # Out to the first peer's answer and back is two hops; the retry then waits its delay.
    assert abs(gap - (delay + 2 * ONE_WAY_S)) < 1e-9, (gap, delay)
