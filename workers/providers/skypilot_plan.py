"""What the SkyPilot provider asks of SkyPilot, decided without SkyPilot: pure translation.

One replica is one SkyPilot cluster named ``mer-<replica name>``.  This module turns a
launch (the replica, the zone SpotHedge chose, spot or on-demand) into the task config
``sky.Task.from_yaml_config`` takes and the keyword arguments of ``sky.launch``, and
turns what SkyPilot reports (the launch request's status, the cluster's status record)
into Meridian's instance states.  No I/O, no clock, no ``sky`` import: the glue
(``workers.providers.skypilot``) runs the calls through a SkyPilot environment.

Placement stays Meridian's: exactly one ``cloud/region/zone`` per launch and
``retry_until_up=False``, so SkyPilot's optimizer and failover never move a replica out
of the zone SpotHedge picked, and a zone without capacity fails fast (SpotHedge §3.2
then moves it to the preemptive set).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPOT = "spot"
ON_DEMAND = "on-demand"
KINDS = (SPOT, ON_DEMAND)
# SkyPilot's cluster names: a letter, then letters, digits, '-', '_' or '.'; Meridian
# keeps to lowercase and the 63 characters a GCP instance name allows.
_CLUSTER_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MAX_CLUSTER_NAME = 63
_UNIQUE_TAIL = 7  # "-" and the replica name's six hex digits
CLUSTER_PREFIX = "mer-"
# A launch that failed for want of capacity: SkyPilot's ResourcesUnavailableError after
# at least one provisioning attempt (its failover_history is non-empty).  The same error
# with an empty history is the optimizer finding nothing feasible (a cloud not enabled,
# an accelerator the zone's catalog lacks): a configuration error, not a full zone.
CAPACITY_ERRORS = frozenset({"ResourcesUnavailableError"})
# Request states of SkyPilot's API server (sky.server.requests.requests.RequestStatus).
REQUEST_PENDING = frozenset({"PENDING", "WAITING", "RUNNING"})
REQUEST_DONE = "SUCCEEDED"


@dataclass(frozen=True)
class SkyZone:
    """One place SkyPilot may launch in, as its ``infra`` field writes it."""

    cloud: str
    region: str
    zone: str

    @property
    def infra(self) -> str:
        return f"{self.cloud}/{self.region}/{self.zone}"


def parse_zones(text: str) -> tuple[SkyZone, ...]:
    """``aws/us-east-1/us-east-1a,gcp/us-central1/us-central1-a`` -> zones; bad -> error."""
    zones = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        parts = item.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(
                f"SkyPilot zone {item!r}: expected cloud/region/zone, e.g. aws/us-east-1/us-east-1a"
            )
        zones.append(SkyZone(parts[0].lower(), parts[1], parts[2]))
    names = [z.zone for z in zones]
    if len(set(names)) != len(names):
        raise ValueError(f"SkyPilot zones: a zone name appears twice in {text!r}")
    return tuple(zones)


@dataclass(frozen=True)
class SkyPilotConfig:
    """The replica's machine and engine; the same for every launch of a provider."""

    zones: tuple[SkyZone, ...]
    accelerators: str = "L4:1"
    port: int = 8000
    disk_size_gb: int = 256
    image_id: str = ""
    vllm_version: str = "0.32.0"

    def __post_init__(self) -> None:
        if not self.zones:
            raise ValueError("SkyPilot provider: no zones configured (MERIDIAN_SKYPILOT_ZONES)")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"SkyPilot provider: port {self.port} is not a TCP port")
        if self.port in (KV_EVENTS_PORT, KV_REPLAY_PORT):
            raise ValueError(f"SkyPilot provider: port {self.port} is the engine's KV events port")
        if self.disk_size_gb < 1:
            raise ValueError("SkyPilot provider: disk size must be at least 1 GB")

    def zone(self, name: str) -> SkyZone:
        for zone in self.zones:
            if zone.zone == name:
                return zone
        known = ", ".join(z.zone for z in self.zones)
        raise KeyError(f"zone {name!r} is not a configured SkyPilot zone ({known})")


def cluster_name(replica_name: str) -> str:
    """``mer-<replica>`` in the characters every cloud accepts, at most 63 of them.

    Replica names end in a unique suffix (``-3f2a1c``, ``scaling_glue.replica_name``): a
    name too long loses characters from its middle, never from that end.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", replica_name.lower()).strip("-")
    if not slug:
        raise ValueError(f"replica name {replica_name!r} has no letters or digits")
    name = f"{CLUSTER_PREFIX}{slug}"
    if len(name) > MAX_CLUSTER_NAME:
        keep = _UNIQUE_TAIL
        name = name[: MAX_CLUSTER_NAME - keep].rstrip("-") + name[-keep:]
    assert _CLUSTER_NAME.fullmatch(name), name
    return name


# The engine: vLLM's OpenAI server on the configured port with the flags Meridian reads
# (docs/engines.md): KV events bound on 5557 with replay on 5558, found by the balancers
# through GET /kv_event_sources, and cached_tokens in usage.  Every replica of a model
# hashes blocks with the same seed.
KV_EVENTS_PORT = 5557
KV_REPLAY_PORT = 5558
RUN = (
    'PYTHONHASHSEED=0 vllm serve "$MODEL" --host 0.0.0.0 --port "$PORT" '
    "--enable-prefix-caching --enable-prompt-tokens-details --kv-events-config "
    '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
    f'"endpoint": "tcp://*:{KV_EVENTS_PORT}", "replay_endpoint": "tcp://*:{KV_REPLAY_PORT}"}}\''
)


def task_config(
    config: SkyPilotConfig, model_name: str, replica_name: str, zone: str, kind: str
) -> dict[str, Any]:
    """The task YAML (as a dict) of one replica pinned to one zone."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {', '.join(KINDS)}")
    if not model_name:
        raise ValueError("a launch needs the model's name")
    resources: dict[str, Any] = {
        "infra": config.zone(zone).infra,
        "accelerators": config.accelerators,
        "use_spot": kind == SPOT,
        "ports": [config.port, KV_EVENTS_PORT, KV_REPLAY_PORT],
        "disk_size": config.disk_size_gb,
    }
    if config.image_id:
        resources["image_id"] = config.image_id
    return {
        "name": cluster_name(replica_name),
        "resources": resources,
        "envs": {"MODEL": model_name, "PORT": str(config.port)},
        "setup": f'pip install "vllm=={config.vllm_version}"',
        "run": RUN,
    }


def launch_kwargs(replica_name: str) -> dict[str, Any]:
    """``sky.launch``'s keyword arguments besides the task.

    ``down=True``: an engine that exits ends its job, and the cluster goes with it
    instead of billing idle.  No autostop: a serving replica is never idle by design.
    """
    return {
        "cluster_name": cluster_name(replica_name),
        "retry_until_up": False,
        "down": True,
        "idle_minutes_to_autostop": None,
    }


# --- what SkyPilot reports -> Meridian's states ---------------------------------------


@dataclass(frozen=True)
class LaunchOutcome:
    """A launch request as the API server reports it."""

    status: str
    error_type: str = ""
    message: str = ""
    attempts: int = 0  # provisioning attempts that failed (the error's failover history)

    @property
    def refused_for_capacity(self) -> bool:
        return self.error_type in CAPACITY_ERRORS and self.attempts > 0


@dataclass(frozen=True)
class ClusterRecord:
    """One row of ``sky.status``: the cluster's name and ``ClusterStatus`` value."""

    name: str
    status: str


@dataclass(frozen=True)
class Observation:
    """What one poll decided about one cluster: its new state and whether to say so."""

    state: str
    notice: str | None = None
    message: str = ""


def observe(
    state: str,
    kind: str,
    outcome: LaunchOutcome | None,
    record: ClusterRecord | None,
    reachable: bool,
) -> Observation:
    """The next state of a tracked cluster.

    ``state`` is ours (provisioning, running); ``outcome`` the launch request (None once
    resolved); ``record`` the cluster's status row (None: SkyPilot no longer knows it);
    ``reachable``: the engine's endpoint answered its health check.
    """
    if state == "provisioning":
        return _while_provisioning(kind, outcome, record, reachable)
    if state == "running":
        if record is not None and record.status == "UP":
            return Observation("running")
        # Left UP without our asking: a spot cluster was reclaimed; an on-demand one
        # failed (the engine exited and down=True took the cluster, or it was stopped).
        event = "preempted" if kind == SPOT else "terminated"
        seen = "gone" if record is None else record.status
        return Observation(event, event, f"cluster {seen} while running")
    raise ValueError(f"no transition from state {state!r}")


def _while_provisioning(
    kind: str, outcome: LaunchOutcome | None, record: ClusterRecord | None, reachable: bool
) -> Observation:
    if outcome is not None and outcome.status in REQUEST_PENDING:
        return Observation("provisioning")
    if outcome is not None and outcome.status != REQUEST_DONE:
        # A refused launch is reported as a preemption at once (SpotHedge's Z_P).
        event = "preempted" if outcome.refused_for_capacity else "terminated"
        detail = f"{outcome.error_type}: {outcome.message}".strip(": ")
        return Observation(event, event, f"launch {outcome.status.lower()}: {detail}")
    # The launch request has resolved (or was lost with a restarted worker): a cluster
    # SkyPilot no longer knows went away before it ever served.
    if record is None:
        event = "preempted" if kind == SPOT else "terminated"
        return Observation(event, event, "cluster gone before its engine answered")
    if record.status != "UP":
        return Observation("provisioning")
    if not reachable:
        return Observation("provisioning")  # the cluster is up, the engine still loading
    return Observation("running", "running")


def endpoint_url(endpoint: str) -> str:
    """``sky.endpoints`` gives ``host:port`` (or a URL for some clouds)."""
    if not endpoint:
        raise ValueError("SkyPilot gave an empty endpoint")
    return endpoint if "://" in endpoint else f"http://{endpoint}"


def plan_lines(
    config: SkyPilotConfig,
    model_name: str,
    replica_name: str,
    zone: str,
    kind: str,
) -> list[str]:
    """The calls a launch of this replica makes, in order (the dry run prints them)."""
    name = cluster_name(replica_name)
    args = ", ".join(f"{k}={v!r}" for k, v in launch_kwargs(replica_name).items())
    place = config.zone(zone)
    loss = "preemption" if kind == SPOT else "failure"
    return [
        f"1. task = sky.Task.from_yaml_config(<the YAML above>)  # {kind} in {place.infra}",
        f"2. request = sky.launch(task, {args})",
        "3. each beat: sky.api_status([request]) until SUCCEEDED; a failure with "
        + ", ".join(sorted(CAPACITY_ERRORS))
        + " after a provisioning attempt reports the zone as preempted (SpotHedge moves it"
        " to Z_P); any other failure terminates the replica",
        f"4. each beat: sky.status(cluster_names=[{name!r}, ...], refresh=AUTO); "
        f"UP -> sky.endpoints({name!r}, {config.port}) -> GET /health until it answers",
        f"5. the replica runs at the endpoint; its cluster leaving UP is a {loss}",
        f"6. scale-down: sky.down({name!r})",
    ]


def records_from(rows: Sequence[Mapping[str, Any]]) -> dict[str, ClusterRecord]:
    """Status rows from the bridge -> records by cluster name; a malformed row is an error."""
    records = {}
    for row in rows:
        name, status = row.get("name"), row.get("status")
        if not isinstance(name, str) or not isinstance(status, str):
            raise ValueError(f"SkyPilot status row without a name and status: {row!r}")
        records[name] = ClusterRecord(name, status)
    return records


def to_yaml(value: Mapping[str, Any], indent: int = 0) -> str:
    """A task config as YAML: block mappings, scalars in JSON's spelling (a subset of YAML,
    so quotes, ``$`` and braces in the engine command need no YAML escaping rules)."""
    lines = []
    pad = "  " * indent
    for key, item in value.items():
        if isinstance(item, Mapping) and item:
            lines.append(f"{pad}{key}:")
            lines.append(to_yaml(item, indent + 1))
        elif isinstance(item, Mapping):
            lines.append(f"{pad}{key}: {{}}")
        elif isinstance(item, list | tuple):
            lines.append(f"{pad}{key}: {json.dumps(list(item))}")
        else:
            lines.append(f"{pad}{key}: {json.dumps(item)}")
    return "\n".join(lines)
