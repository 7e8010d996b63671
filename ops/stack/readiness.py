"""Wait until the stack's HTTP services answer, failing fast when a child has died."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterable

import httpx

from ops.stack.supervisor import Child, tail


class StartupError(RuntimeError):
    pass


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) != 0


def wait_until_answering(urls: Iterable[str], children: Iterable[Child], *, timeout: float) -> None:
    """Wait until every URL answers HTTP (any status); raise with the log of a dead child."""
    pending = list(urls)
    watched = list(children)
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while pending:
            for child in watched:
                if child.process.poll() is not None:
                    raise StartupError(
                        f"{child.spec.name} exited with {child.process.returncode} during "
                        f"start-up; last lines of {child.log_path}:\n{tail(child.log_path)}"
                    )
            pending = [url for url in pending if not _answers(client, url)]
            if pending and time.monotonic() > deadline:
                raise StartupError(f"not answering after {timeout:.0f}s: {', '.join(pending)}")
            if pending:
                time.sleep(0.2)


def _answers(client: httpx.Client, url: str) -> bool:
    try:
        client.get(url)
    except httpx.HTTPError:
        return False
    return True
