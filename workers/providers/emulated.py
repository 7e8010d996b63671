"""A cloud on this machine: launches real emulated replicas (``python -m sim.serve``).

A launch is billed at once and becomes a running replica process after the cold-start
model's delay (instance provisioning + model load, per kind and zone; SkyServe §2.3
measured 183 s for Llama-2-7B on AWS).  Spot capacity per zone comes from a
``SpotTrace`` (a SkyPilot trace file, or a Poisson model rendered into one) replayed
from the provider's start at ``time_scale`` trace seconds per second: a spot launch is
refused while the zone's launched spot replicas already fill its capacity, and when
capacity drops the newest spot replicas there are preempted — their process killed
with SIGKILL, as a reclaimed VM vanishes.  With ``warning_s`` > 0 the cloud announces
each preemption that far ahead (AWS gives two minutes): the spot replicas a capacity drop
``warning_s`` from now will reclaim get one ``preemption-warning`` notice, and are the
first reclaimed when the drop lands.  On-demand capacity never runs out.

Processes are children of the process that owns the provider (the Celery worker); the
instances live in memory and the ``Replica`` rows are the durable record.
"""

from __future__ import annotations

import builtins
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from workers.providers.base import PREEMPTION_WARNING, CloudProvider, Instance, LaunchSpec, Notice
from workers.scaling.fleet import SPOT, ZoneOffer
from workers.scaling.traces import SpotTrace

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ColdStartModel:
    """Seconds from launch to a running replica process."""

    provision_s: Mapping[str, float] = field(
        default_factory=lambda: {"spot": 20.0, "on-demand": 20.0}
    )
    model_load_s: float = 10.0
    zone_extra_s: Mapping[str, float] = field(default_factory=dict)

    def delay(self, zone: str, kind: str) -> float:
        return (
            self.provision_s.get(kind, 0.0) + self.model_load_s + self.zone_extra_s.get(zone, 0.0)
        )


@dataclass(frozen=True)
class SpotMarket:
    """A trace replayed from ``origin`` (provider clock) at ``time_scale``."""

    trace: SpotTrace | None
    origin: float
    time_scale: float = 1.0

    def capacity(self, zone: str, now: float) -> int | None:
        if self.trace is None:
            return None
        return self.trace.capacity(zone, (now - self.origin) * self.time_scale)


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class _Slot:
    instance: Instance
    spec: LaunchSpec
    port: int
    start_at: float
    process: subprocess.Popen[bytes] | None = None
    warned: bool = False


class EmulatedCloudProvider(CloudProvider):
    name = "emulated"

    def __init__(
        self,
        zones: Sequence[ZoneOffer],
        market: SpotMarket,
        cold_start: ColdStartModel,
        *,
        serve_args: Sequence[str] = (),
        log_dir: Path | None = None,
        port_allocator: Callable[[], int] = free_local_port,
        warning_s: float = 0.0,
    ) -> None:
        if warning_s < 0:
            raise ValueError(f"preemption warning_s must be >= 0, not {warning_s}")
        self.warning_s = warning_s
        self._zones = list(zones)
        self.market = market
        self.cold_start = cold_start
        self.serve_args = list(serve_args)
        self.log_dir = log_dir
        self.port_allocator = port_allocator
        self.slots: dict[str, _Slot] = {}
        self._ids = itertools.count(1)

    def zones(self) -> list[ZoneOffer]:
        return list(self._zones)

    def _live(self) -> list[_Slot]:
        return [s for s in self.slots.values() if s.instance.ended_at is None]

    def _spot_in(self, zone: str) -> list[_Slot]:
        return [s for s in self._live() if s.instance.kind == SPOT and s.instance.zone == zone]

    def launch(self, spec: LaunchSpec, zone: str, kind: str, now: float) -> Instance | None:
        capacity = self.market.capacity(zone, now)
        if kind == SPOT and capacity is not None and len(self._spot_in(zone)) >= capacity:
            return None
        port = self.port_allocator()
        handle = f"emu-{next(self._ids)}"
        instance = Instance(handle, kind, zone, f"http://127.0.0.1:{port}", "provisioning", now)
        self.slots[handle] = _Slot(instance, spec, port, now + self.cold_start.delay(zone, kind))
        return instance

    def terminate(self, handle: str, now: float) -> None:
        slot = self.slots[handle]
        if slot.instance.ended_at is None:
            self._stop(slot, signal.SIGTERM)
            slot.instance = replace(slot.instance, state="terminated", ended_at=now)

    def list(self) -> list[Instance]:
        return [s.instance for s in self.slots.values()]

    def poll(self, now: float) -> builtins.list[Notice]:
        notices = self._preempt(now) + self._warn(now)
        for slot in self._live():
            if slot.process is None and slot.start_at <= now:
                slot.process = self._spawn(slot)
                slot.instance = replace(slot.instance, state="running")
                notices.append(Notice(slot.instance.handle, "running", slot.instance.zone, now))
        return notices

    def _doomed(self, zone: str, at: float) -> builtins.list[_Slot]:
        """The spot replicas in ``zone`` that the capacity at ``at`` leaves no room for:
        warned ones first, then the newest."""
        capacity = self.market.capacity(zone, at)
        spot = sorted(self._spot_in(zone), key=lambda s: (s.warned, s.instance.launched_at))
        excess = len(spot) - capacity if capacity is not None else 0
        return spot[len(spot) - excess :] if excess > 0 else []

    def _warn(self, now: float) -> builtins.list[Notice]:
        if self.warning_s <= 0:
            return []
        notices = []
        at = now + self.warning_s
        for zone in sorted({s.instance.zone for s in self._live() if s.instance.kind == SPOT}):
            for slot in self._doomed(zone, at):
                if not slot.warned:
                    slot.warned = True
                    handle = slot.instance.handle
                    notices.append(Notice(handle, PREEMPTION_WARNING, zone, now, preempt_at=at))
        return notices

    def _preempt(self, now: float) -> builtins.list[Notice]:
        notices = []
        for zone in sorted({s.instance.zone for s in self._live() if s.instance.kind == SPOT}):
            for slot in self._doomed(zone, now):
                self._stop(slot, signal.SIGKILL)
                slot.instance = replace(slot.instance, state="preempted", ended_at=now)
                notices.append(Notice(slot.instance.handle, "preempted", zone, now))
        return notices

    def _spawn(self, slot: _Slot) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "sim.serve", "--model", slot.spec.model_name]
        argv += ["--replica", f"{slot.spec.replica_name}={slot.port}", "--host", "127.0.0.1"]
        log = subprocess.DEVNULL if self.log_dir is None else self._log(slot)
        try:
            # Own session: a preemption kills the replica's whole group, nothing else.
            return subprocess.Popen(
                argv + self.serve_args,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log != subprocess.DEVNULL:
                os.close(log)  # the child holds its own copy

    def _log(self, slot: _Slot) -> int:
        assert self.log_dir is not None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{slot.spec.replica_name}.log"
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _stop(self, slot: _Slot, sig: signal.Signals) -> None:
        process = slot.process
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def close(self) -> None:
        """Stop every replica process (worker shutdown, tests)."""
        for slot in self.slots.values():
            self._stop(slot, signal.SIGKILL)
