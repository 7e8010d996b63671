"""The README's run command, end to end: a new user's first five minutes."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from ops import http_probe
from ops.stack.readiness import port_is_free
from tests.support.polling import eventually, log_shows
from tests.support.processes import ProcessGroup, free_port, free_port_run

pytestmark = pytest.mark.integration


def processes_with_env(marker: str) -> list[int]:
    """Processes whose environment contains ``marker`` (every child inherits the demo's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in environ:
            found.append(int(entry.name))
    return found


def test_run_command_brings_up_the_demo_streams_and_stops_everything(
    processes: ProcessGroup,
    redis_server,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    var_dir = tmp_path / "var"
    console_port = free_port()
    # The demo listens on base+1 .. base+N.
    balancer_base, replica_base = free_port_run(4), free_port_run(10)
    redis_url = redis_server.url.rsplit("/", 1)[0] + "/3"  # its own Redis database
    env = {
        "MERIDIAN_VAR_DIR": str(var_dir),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "REDIS_URL": redis_url,
        "MERIDIAN_CONSOLE_PORT": str(console_port),
        "MERIDIAN_BALANCER_BASE_PORT": str(balancer_base),
        "MERIDIAN_REPLICA_BASE_PORT": str(replica_base),
        "MERIDIAN_SIM_TIME_SCALE": "0.05",
        "MERIDIAN_PROBE_PERIOD_S": "2",
    }
    demo = processes.python("run_demo", "manage.py", "run_demo", "--no-traffic", env=env)
    text = log_shows(processes, "run_demo", demo, r"Press Ctrl-C to stop", timeout=150)

    api_key = re.search(r"API key\s+(mk-\S+)", text).group(1)  # type: ignore[union-attr]
    password = re.search(r"user: admin\s+password: (\S+)", text).group(1)  # type: ignore[union-attr]
    us_east = f"http://127.0.0.1:{balancer_base + 1}/v1"
    assert us_east in text

    client = OpenAI(base_url=us_east, api_key=api_key, max_retries=0, timeout=30)
    stream = client.chat.completions.create(
        model="meridian-demo",
        messages=[{"role": "user", "content": "Say hello from Meridian"}],
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=12,
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12

    console = f"http://127.0.0.1:{console_port}"
    assert http_probe.get(f"{console}/static/console/console.css").status_code == 200
    with httpx.Client(base_url=console, follow_redirects=True) as browser:
        login = browser.get("/admin/login/?next=/")
        token = browser.cookies["csrftoken"]
        page = browser.post(
            "/admin/login/?next=/",
            data={
                "username": "admin",
                "password": password,
                "csrfmiddlewaretoken": token,
                "next": "/",
            },
            headers={"Referer": str(login.url)},
        )
        assert page.status_code == 200 and 'data-region="ap-southeast"' in page.text

    # Ctrl-C under make: the demo gets the terminal's SIGINT and make's SIGTERM on its heels;
    # the second must not cut the shutdown short and orphan children.
    demo.send_signal(signal.SIGINT)
    eventually(lambda: "Stopping" in processes.log_of("run_demo"), what="the demo stopping")
    demo.send_signal(signal.SIGTERM)  # while it waits for its children to exit
    assert demo.wait(timeout=40) == 0
    assert "Every process stopped." in processes.log_of("run_demo")
    assert processes_with_env(f"MERIDIAN_VAR_DIR={var_dir}") == []
    ports = [console_port] + [balancer_base + i for i in (1, 2, 3)]
    ports += [replica_base + i for i in range(1, 10)]
    assert all(port_is_free("127.0.0.1", port) for port in ports)
