"""The SkyPilot bridge with SkyPilot's API server replaced by an in-memory one.

Run by the SkyPilot environment's python (``tests/workers/test_skypilot_provider.py``
starts it in the bridge's place).  Everything below the SDK is faked, nothing above:
``sky.launch``, ``sky.api_status``, ``sky.get``, ``sky.status``, ``sky.endpoints`` and
``sky.down`` are ``create_autospec`` copies of the installed SDK functions (a call that
does not bind to the real signature raises ``TypeError``), and what they hand back are
SkyPilot's own objects: ``RequestId``, ``RequestPayload``, ``StatusResponse`` with a
``ClusterStatus``, and ``ResourcesUnavailableError`` raised by ``sky.get`` for a launch
without capacity.  ``sky.get`` hands results and errors through SkyPilot's own wire
encoding (its encoders and decoders, JSON, its exception serialization), as the server
and the SDK do.  The task the bridge launches is a real ``sky.Task``.

The test steers the cloud with one extra op, ``_cloud``:

- ``finish`` cluster, outcome (``up`` | ``no-capacity`` | ``infeasible``), endpoint: the
  launch completes
- ``reclaim`` cluster: the cloud takes a spot cluster away (SkyPilot's refresh drops it)
- ``calls``: the SDK calls made so far, with their arguments
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import sky
from sky import exceptions
from sky.schemas.api import responses
from sky.server import common as server_common
from sky.server.requests import payloads
from sky.server.requests.serializers import decoders, encoders
from sky.utils import status_lib

BRIDGE = Path(__file__).resolve().parents[2] / "workers" / "providers" / "sky_bridge.py"


class FakeApiServer:
    def __init__(self) -> None:
        self.requests: dict[str, dict[str, Any]] = {}
        self.clusters: dict[str, status_lib.ClusterStatus] = {}
        self.addresses: dict[str, str] = {}
        self.launches: dict[str, str] = {}  # cluster -> its launch request
        self.calls: list[dict[str, Any]] = []

    def _request(self, name: str, status: str, result: Any = None, error: Any = None) -> Any:
        rid = server_common.RequestId(f"req-{len(self.requests) + 1}")
        self.requests[rid] = {"name": name, "status": status, "result": result, "error": error}
        return rid

    # --- the SDK's functions -------------------------------------------------------------

    def launch(self, task: Any, cluster_name: str | None = None, **kwargs: Any) -> Any:
        assert isinstance(task, sky.Task), type(task)
        (res,) = task.resources
        self.calls.append(
            {
                "fn": "launch",
                "cluster_name": cluster_name,
                "kwargs": kwargs,
                "task": {k: v for k, v in task.to_yaml_config().items() if k[0] != "_"},
                "resources": {
                    "cloud": str(res.cloud),
                    "region": res.region,
                    "zone": res.zone,
                    "use_spot": res.use_spot,
                    "accelerators": res.accelerators,
                    "ports": res.ports,
                },
            }
        )
        assert cluster_name is not None
        self.clusters[cluster_name] = status_lib.ClusterStatus.INIT
        rid = self._request("sky.launch", "RUNNING")
        self.launches[cluster_name] = rid
        return rid

    def api_status(self, request_ids: list[Any] | None = None, **kwargs: Any) -> list[Any]:
        found = []
        for rid in request_ids or list(self.requests):
            r = self.requests.get(rid)
            if r is None:
                continue
            found.append(
                payloads.RequestPayload(
                    request_id=rid,
                    name=r["name"],
                    entrypoint=r["name"],
                    request_body="{}",
                    status=r["status"],
                    created_at=0.0,
                    user_id="meridian",
                    return_value="",
                    error="",
                    pid=None,
                    schedule_type="long",
                )
            )
        return found

    def get(self, request_id: Any) -> Any:
        """As the API server stores a request's outcome and the SDK reads it back: the
        result through SkyPilot's encoder, JSON and decoder for the request's name, an
        error serialized, pickled and re-raised by SkyPilot's own functions."""
        r = self.requests[request_id]
        if r["error"] is not None:
            wire = encoders.pickle_and_encode(exceptions.serialize_exception(r["error"]))
            raise exceptions.deserialize_exception(decoders.decode_and_unpickle(wire))
        encoded = json.dumps(encoders.get_encoder(r["name"])(r["result"]))
        return decoders.get_decoder(r["name"])(json.loads(encoded))

    def status(self, cluster_names: list[str] | None = None, **kwargs: Any) -> Any:
        self.calls.append({"fn": "status", "cluster_names": cluster_names, **_plain(kwargs)})
        names = [n for n in cluster_names or list(self.clusters) if n in self.clusters]
        rows = [_row(n, self.clusters[n]) for n in names]
        return self._request("sky.status", "SUCCEEDED", rows)

    def endpoints(self, cluster: str, port: int | str | None = None) -> Any:
        self.calls.append({"fn": "endpoints", "cluster": cluster, "port": port})
        assert port is not None
        return self._request("sky.endpoints", "SUCCEEDED", {int(port): self.addresses[cluster]})

    def down(self, cluster_name: str, **kwargs: Any) -> Any:
        self.calls.append({"fn": "down", "cluster_name": cluster_name, **kwargs})
        self.clusters.pop(cluster_name, None)
        return self._request("sky.down", "SUCCEEDED")

    # --- the test's hand on the cloud ------------------------------------------------------

    def cloud(self, req: dict[str, Any]) -> dict[str, Any]:
        action = req["action"]
        if action == "calls":
            return {"ok": True, "result": {"calls": self.calls}}
        cluster = req["cluster"]
        if action == "finish":
            launch = self.requests[self.launches[cluster]]
            if req["outcome"] == "up":
                launch["status"] = "SUCCEEDED"
                self.clusters[cluster] = status_lib.ClusterStatus.UP
                self.addresses[cluster] = req["endpoint"]
            else:
                launch["status"] = "FAILED"
                launch["error"] = _launch_error(req["outcome"], req.get("zone", "the zone"))
                self.clusters.pop(cluster, None)
        elif action == "reclaim":
            self.clusters.pop(cluster, None)
        else:
            return {"ok": False, "error": f"unknown cloud action {action!r}"}
        return {"ok": True, "result": {}}


def _launch_error(outcome: str, zone: str) -> Exception:
    """What SkyPilot raises: after a provisioning attempt in the zone, or from its optimizer
    before any attempt (an empty failover history)."""
    if outcome == "no-capacity":
        attempt = exceptions.ResourcesUnavailableError(f"{zone}: InsufficientInstanceCapacity")
        return exceptions.ResourcesUnavailableError(
            f"Failed to provision all possible launchable resources in {zone}",
            failover_history=[attempt],
        )
    if outcome == "infeasible":
        return exceptions.ResourcesUnavailableError(
            "Catalog does not contain any instances satisfying the request"
        )
    raise ValueError(f"unknown launch outcome {outcome!r}")


def _row(name: str, status: status_lib.ClusterStatus) -> Any:
    return responses.StatusResponse(
        name=name,
        launched_at=0,
        status=status,
        autostop=-1,
        to_down=True,
        cluster_hash=f"hash-{name}",
        cluster_ever_up=status == status_lib.ClusterStatus.UP,
        user_hash="meridian",
        user_name="meridian",
        workspace="default",
        is_managed=False,
        nodes=1,
    )


def _plain(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in kwargs.items()}


def load_bridge() -> Any:
    spec = importlib.util.spec_from_file_location("sky_bridge", BRIDGE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    server = FakeApiServer()
    bridge = load_bridge()
    for name in ("launch", "api_status", "get", "status", "endpoints", "down"):
        real = getattr(sky, name)
        fake = mock.create_autospec(real, side_effect=getattr(server, name))
        setattr(sky, name, fake)
    # The bridge wraps an op's result in {"ok": true, ...}; _cloud answers in full.
    handle = bridge.handle

    def handle_with_cloud(req: dict[str, Any]) -> dict[str, Any]:
        if req.get("op") == "_cloud":
            return server.cloud(req)
        return handle(req)

    bridge.handle = handle_with_cloud
    bridge.serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
