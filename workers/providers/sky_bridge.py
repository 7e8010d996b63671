"""SkyPilot's Python SDK behind a JSON-lines pipe, run by the interpreter of SkyPilot's own
environment (``ops/install_skypilot.sh``).

SkyPilot pins ``uvicorn<0.36`` and ``click<8.2``; Meridian's balancers need uvicorn 0.54.
The two cannot share one environment, so the provider (``workers.providers.skypilot``)
starts this script as a child under SkyPilot's interpreter and sends it one request per
line; it answers one line each.  It imports only the standard library and ``sky``, and
decides nothing: the task config and the launch arguments come rendered
(``workers.providers.skypilot_plan``), SkyPilot's objects and exceptions go back as plain
fields.

Requests (``op`` and its fields) and results:

- ``version``                               -> {"version"}
- ``render``   task                         -> SkyPilot's own normalized task YAML and
                                               the resources it parsed (validation)
- ``launch``   task, kwargs                 -> {"request_id"}   (sky.launch, not awaited)
- ``request``  request_id                   -> {"status", "error_type", "message", "attempts"}
- ``status``   clusters, refresh            -> {"clusters": [{"name", "status"}]}
- ``endpoint`` cluster, port                -> {"endpoint"}     (sky.endpoints)
- ``down``     cluster                      -> {"request_id"}   (sky.down, not awaited)

Every answer is ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

import sky  # the SkyPilot environment's package


def _version(req: dict[str, Any]) -> dict[str, Any]:
    return {"version": sky.__version__}


def _render(req: dict[str, Any]) -> dict[str, Any]:
    task = sky.Task.from_yaml_config(req["task"])
    config = task.to_yaml_config()
    config.pop("_user_specified_yaml", None)
    resources = [
        {
            "cloud": str(r.cloud) if r.cloud is not None else None,
            "region": r.region,
            "zone": r.zone,
            "use_spot": r.use_spot,
            "accelerators": r.accelerators,
            "ports": r.ports,
        }
        for r in task.resources
    ]
    return {"config": config, "resources": resources}


def _launch(req: dict[str, Any]) -> dict[str, Any]:
    task = sky.Task.from_yaml_config(req["task"])
    return {"request_id": str(sky.launch(task, **req["kwargs"]))}


def _request(req: dict[str, Any]) -> dict[str, Any]:
    rid = req["request_id"]
    payloads = sky.api_status([rid])
    if not payloads:
        return {"status": "FAILED", "error_type": "RequestNotFound", "message": rid, "attempts": 0}
    status = str(payloads[0].status)
    if status != "FAILED":
        return {"status": status, "error_type": "", "message": "", "attempts": 0}
    try:
        sky.get(rid)  # re-raises the request's exception here
    except Exception as e:
        # ResourcesUnavailableError's failover_history: the provisioning attempts that
        # failed; empty when the optimizer found nothing feasible to try.
        attempts = len(getattr(e, "failover_history", None) or ())
        return {
            "status": status,
            "error_type": type(e).__name__,
            "message": str(e)[:500],
            "attempts": attempts,
        }
    return {"status": status, "error_type": "", "message": "", "attempts": 0}


def _status(req: dict[str, Any]) -> dict[str, Any]:
    from sky.utils.common import StatusRefreshMode

    names = list(req["clusters"])
    if not names:
        return {"clusters": []}
    refresh = StatusRefreshMode.AUTO if req.get("refresh", True) else StatusRefreshMode.NONE
    rows = sky.get(sky.status(cluster_names=names, refresh=refresh))
    return {"clusters": [{"name": r.name, "status": r.status.value} for r in rows]}


def _endpoint(req: dict[str, Any]) -> dict[str, Any]:
    port = int(req["port"])
    endpoints = sky.get(sky.endpoints(req["cluster"], port))
    found = endpoints.get(port) or endpoints.get(str(port)) or ""
    return {"endpoint": found}


def _down(req: dict[str, Any]) -> dict[str, Any]:
    return {"request_id": str(sky.down(req["cluster"]))}


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "version": _version,
    "render": _render,
    "launch": _launch,
    "request": _request,
    "status": _status,
    "endpoint": _endpoint,
    "down": _down,
}


def handle(req: dict[str, Any]) -> dict[str, Any]:
    op = OPS.get(req.get("op", ""))
    if op is None:
        return {
            "ok": False,
            "error": f"unknown op {req.get('op')!r}; expected one of {sorted(OPS)}",
        }
    try:
        return {"ok": True, "result": op(req)}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def serve(lines: TextIO, out: TextIO) -> None:
    for line in lines:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as e:
            answer = {"ok": False, "error": f"not a JSON request: {e}"}
        else:
            answer = handle(req)
        out.write(json.dumps(answer, default=str) + "\n")
        out.flush()


def main() -> None:
    # SkyPilot prints progress to stdout: answers get a descriptor of their own, and
    # whatever else is printed goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin, answers)


if __name__ == "__main__":
    main()
