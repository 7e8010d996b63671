"""SkyPilotProvider: replicas on real clouds, one SkyPilot cluster each.

The calls go through SkyPilot's Python SDK (``sky.launch``, ``sky.api_status``,
``sky.status``, ``sky.endpoints``, ``sky.down``), run by ``sky_bridge.py`` under the
interpreter of SkyPilot's own environment (its pins and Meridian's cannot share one;
``MERIDIAN_SKYPILOT_PYTHON``).  What to ask and what the answers mean is decided in
``skypilot_plan`` (pure); this module only carries calls and keeps the clusters it
launched.

Nothing here waits for a cloud: ``launch`` submits and returns a provisioning instance,
each ``poll`` (one per scaling beat) asks for the launch requests' outcomes and the
clusters' status, and a replica is ``running`` once its cluster is UP and the engine's
endpoint answers ``GET /health``.  A launch refused for capacity is reported as a
preemption, as the emulated cloud reports a refused spot launch.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import select
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from workers.providers.base import CloudProvider, Instance, LaunchSpec, Notice
from workers.providers.skypilot_plan import (
    ClusterRecord,
    LaunchOutcome,
    SkyPilotConfig,
    endpoint_url,
    launch_kwargs,
    observe,
    records_from,
    task_config,
)
from workers.scaling.fleet import ZoneOffer

log = logging.getLogger(__name__)
BRIDGE = Path(__file__).with_name("sky_bridge.py")


class SkyPilotError(RuntimeError):
    """SkyPilot (or its environment) answered with an error."""


def bridge_argv(python: str) -> list[str]:
    # -P: not the script's folder on sys.path, whose modules (base, static) would shadow
    # packages of the same names in SkyPilot's environment.
    return [python, "-P", str(BRIDGE)]


class SkyBridge:
    """The child process that runs SkyPilot's SDK; one JSON line each way per call."""

    def __init__(self, argv: Sequence[str], timeout_s: float = 120.0) -> None:
        self.argv, self.timeout_s = list(argv), timeout_s
        self.process = self._start()

    def _start(self) -> subprocess.Popen[str]:
        try:
            return subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
            )
        except OSError as e:
            raise SkyPilotError(f"cannot start SkyPilot's interpreter {self.argv[0]!r}: {e}") from e

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        if self.process.poll() is not None:
            # A bridge that died (killed, out of memory) is started again: the clusters'
            # state lives in SkyPilot and in the provider, not in the bridge.
            log.warning("SkyPilot bridge exited (%s); starting it again", self.process.returncode)
            self.close()
            self.process = self._start()
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write(json.dumps({"op": op, **fields}) + "\n")
        stdin.flush()
        ready, _, _ = select.select([stdout], [], [], self.timeout_s)
        line = stdout.readline() if ready else ""
        if not line:
            # Its answer may still come and would be read as the next call's: end it.
            self.process.kill()
            self.process.wait()
            raise SkyPilotError(f"no answer from the SkyPilot bridge to {op!r}")
        answer = json.loads(line)
        if not answer.get("ok"):
            raise SkyPilotError(f"SkyPilot {op}: {answer.get('error')}")
        result: dict[str, Any] = answer["result"]
        return result

    def close(self) -> None:
        stdin, stdout = self.process.stdin, self.process.stdout
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()  # the bridge's loop ends at end of input
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if stdout is not None:
            stdout.close()


def engine_ready(url: str) -> bool:
    """vLLM's ``/health`` answers 200 once the model is loaded."""
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class _Cluster:
    instance: Instance
    request_id: str | None  # the launch request, until it has resolved


class SkyPilotProvider(CloudProvider):
    name = "skypilot"

    def __init__(
        self,
        config: SkyPilotConfig,
        offers: Sequence[ZoneOffer],
        bridge: SkyBridge,
        *,
        ready: Callable[[str], bool] = engine_ready,
    ) -> None:
        self.config, self.bridge, self.ready = config, bridge, ready
        names = {z.zone for z in config.zones}
        self._offers = [o for o in offers if o.name in names]
        missing = names - {o.name for o in self._offers}
        if missing:
            raise ValueError(
                f"SkyPilot zones without a Zone row (and price): {', '.join(sorted(missing))}"
            )
        self.clusters: dict[str, _Cluster] = {}

    def zones(self) -> list[ZoneOffer]:
        return list(self._offers)

    def launch(self, spec: LaunchSpec, zone: str, kind: str, now: float) -> Instance | None:
        task = task_config(self.config, spec.model_name, spec.replica_name, zone, kind)
        kwargs = launch_kwargs(spec.replica_name)
        request_id = str(self.bridge.call("launch", task=task, kwargs=kwargs)["request_id"])
        # Billed from now: the cloud bills the cold start too (SkyServe §2.3).
        instance = Instance(kwargs["cluster_name"], kind, zone, "", "provisioning", now)
        self.clusters[instance.handle] = _Cluster(instance, request_id)
        return instance

    def adopt(self, instance: Instance) -> None:
        """Track a cluster launched before this process started (a worker restart)."""
        self.clusters[instance.handle] = _Cluster(instance, None)

    def terminate(self, handle: str, now: float) -> None:
        cluster = self.clusters[handle]
        if cluster.instance.ended_at is None:
            self.bridge.call("down", cluster=handle)
            cluster.instance = replace(cluster.instance, state="terminated", ended_at=now)

    def list(self) -> list[Instance]:
        return [c.instance for c in self.clusters.values()]

    def poll(self, now: float) -> builtins.list[Notice]:
        live = [c for c in self.clusters.values() if c.instance.ended_at is None]
        if not live:
            return []
        names = [c.instance.handle for c in live]
        records = records_from(self.bridge.call("status", clusters=names)["clusters"])
        notices = []
        for cluster in live:
            notice = self._advance(cluster, records.get(cluster.instance.handle), now)
            if notice is not None:
                notices.append(notice)
        return notices

    def _advance(
        self, cluster: _Cluster, record: ClusterRecord | None, now: float
    ) -> Notice | None:
        instance = cluster.instance
        outcome = self._outcome(cluster)
        url, reachable = instance.url, False
        # Only a cluster that is up and not yet serving needs its address and a probe;
        # a running replica's health is the control plane's probes' business.
        if instance.state == "provisioning" and record is not None and record.status == "UP":
            url = url or self._endpoint(instance.handle)
            reachable = bool(url) and self.ready(url)
        seen = observe(instance.state, instance.kind, outcome, record, reachable)
        ended = now if seen.state in ("preempted", "terminated") else None
        cluster.instance = replace(instance, state=seen.state, url=url, ended_at=ended)
        if seen.notice is None:
            return None
        if seen.message:
            log.warning("SkyPilot cluster %s: %s", instance.handle, seen.message)
        return Notice(instance.handle, seen.notice, instance.zone, now, url=url)

    def _outcome(self, cluster: _Cluster) -> LaunchOutcome | None:
        if cluster.request_id is None:
            return None
        answer = self.bridge.call("request", request_id=cluster.request_id)
        outcome = LaunchOutcome(
            answer["status"], answer["error_type"], answer["message"], int(answer["attempts"])
        )
        if outcome.status == "SUCCEEDED":
            cluster.request_id = None  # resolved; the cluster's status says the rest
        return outcome

    def _endpoint(self, handle: str) -> str:
        endpoint = self.bridge.call("endpoint", cluster=handle, port=self.config.port)["endpoint"]
        return endpoint_url(str(endpoint)) if endpoint else ""

    def close(self) -> None:
        self.bridge.close()
