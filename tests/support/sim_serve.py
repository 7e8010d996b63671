"""Emulated replicas (``python -m sim.serve``) as child processes on loopback ports.

One process serves every replica it is given, each on its own port, at a small
``--time-scale`` so modeled GPU time stays short.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from tests.support.metrics import metric
from tests.support.processes import ProcessGroup, free_port, wait_http

TIME_SCALE = "0.02"


def serve_replicas(
    group: ProcessGroup, label: str, ports: dict[str, int], *extra: str, model: str
) -> subprocess.Popen[bytes]:
    """One ``sim.serve`` process serving ``ports`` (name -> port), once all listen.

    ``extra`` goes on its command line (``--max-num-seqs 2`` fills a batch fast;
    a later ``--time-scale`` overrides the default)."""
    args = ["-m", "sim.serve", "--model", model, "--time-scale", TIME_SCALE, *extra]
    for name, port in ports.items():
        args += ["--replica", f"{name}={port}"]
    process = group.python(label, *args)
    for port in ports.values():
        wait_http(f"http://127.0.0.1:{port}/health", process=process)
    return process


@dataclass
class ServedReplicas:
    """A ``sim.serve`` child process and the base URL of each of its replicas."""

    process: subprocess.Popen[bytes]
    urls: dict[str, str]
    kv_port_base: int

    def metric(self, name: str, replica: str, **labels: str) -> float:
        return metric(self.urls[replica], name, **labels)


def start_replicas(
    group: ProcessGroup, names: list[str], *extra: str, kv_port_base: int | None = None
) -> ServedReplicas:
    """Replicas ``names`` of the demo model in one process, with KV events on ports
    from ``kv_port_base`` when given."""
    ports = {name: free_port() for name in names}
    if kv_port_base is not None:
        extra = (*extra, "--kv-events-port-base", str(kv_port_base))
    process = serve_replicas(group, "sim-" + "-".join(names), ports, *extra, model="meridian-demo")
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    return ServedReplicas(process, urls, kv_port_base or 0)
