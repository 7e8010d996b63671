"""A scripted network for one ``SimBalancer``: replicas and peers the test controls.

``sim.des.world.World`` runs replicas on the real engine, whose timing decides
when each request finishes.  A test that scripts events one by one wants the
opposite: a replica whose ``/metrics`` shows what the test set and that answers
a request only when told (``ScriptedReplica``), and a peer balancer that refuses
every forward with a fixed status (``RefusingPeer``), all one short hop away.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.engine_metrics import EngineLoad
from core.peers import Heartbeat
from sim.des.calls import SimCall, refused
from sim.des.loop import EventLoop
from sim.des.replica import Generation
from sim.engine import EngineRequest, FinishReason, RequestOutput

ONE_WAY_S = 0.001


@dataclass
class ScriptedReplica:
    name: str
    region: str
    running: int = 0
    waiting: int = 0
    held: dict[str, tuple[EngineRequest, Generation]] = field(default_factory=dict)

    def load(self) -> EngineLoad:
        return EngineLoad(running=self.running, waiting=self.waiting, kv_usage=0.0)

    def submit(self, request: EngineRequest, generation: Generation) -> None:
        self.held[request.request_id] = (request, generation)

    def finish(self, request_id: str) -> None:
        """Answer ``request_id`` now: one token, then the end."""
        request, generation = self.held.pop(request_id)
        prompt = len(request.prompt_token_ids)
        generation.on_first()
        output = RequestOutput(request_id, [7], FinishReason.LENGTH, prompt, 1, 0)
        generation.on_done(output, [7])


@dataclass
class RefusingPeer:
    """A peer balancer that answers every forward with ``status``."""

    region: str
    status: int = 503
    code: str = "no_healthy_replica"
    received: list[str] = field(default_factory=list)

    def submit(self, call: SimCall) -> None:
        self.received.append(call.descriptor.request_id)
        call.on_done(refused(self.status, self.code))

    def heartbeat(self) -> Heartbeat:
        raise AssertionError("the scripted network polls no peer: the test reports for it")


class ScriptedNetwork:
    """``sim.des.balancer.Network`` with everything ``ONE_WAY_S`` away."""

    def __init__(self, replicas: list[ScriptedReplica], peers: dict[str, RefusingPeer]) -> None:
        self.loop = EventLoop()
        self.replicas = {r.name: r for r in replicas}
        self.peers = peers

    def one_way_s(self, a: str, b: str) -> float:
        return ONE_WAY_S

    def replica(self, name: str) -> ScriptedReplica:
        return self.replicas[name]

    def balancer(self, name: str) -> RefusingPeer:
        return self.peers[name]
