"""``bench proxy --peers``: the peer routers' installs, command lines and a tiny real run.

The install is never attempted against the package registry here: a failed one is
made with an interpreter that does not exist, and a finished one is recognised by
its stamp.  The real run uses the routers only where an earlier
``bench proxy --peers`` installed them in this user's cache directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench.peers import PEERS, env_dir, install, install_all
from ops.embedded_redis import EmbeddedRedis
from ops.stack.readiness import StartupError
from tests.support.commands import run_command


def test_a_router_that_cannot_be_installed_is_skipped_with_a_note(tmp_path: Path) -> None:
    spec = PEERS[0]
    with pytest.raises(StartupError, match="no-such-python"):
        install(spec, tmp_path, python=str(tmp_path / "no-such-python"))

    # install_all uses the running interpreter; point the cache at a file so mkdir fails.
    blocked = tmp_path / "blocked"
    blocked.write_text("not a directory")
    installed = install_all(PEERS, blocked)
    assert installed.executables == {}
    assert [note.split()[0] for note in installed.notes] == [spec.name for spec in PEERS]
    assert all("skipped" in note for note in installed.notes)


def test_a_stamped_environment_is_used_as_it_is(tmp_path: Path) -> None:
    spec = PEERS[1]
    directory = env_dir(spec, tmp_path)
    directory.mkdir(parents=True)
    (directory / ".meridian-installed").write_text("done\n")
    assert install(spec, tmp_path) == directory / "bin" / spec.executable


def test_each_router_gets_every_backend_its_policy_and_its_own_metrics_port() -> None:
    backends = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    for spec in PEERS:
        argv = spec.argv(Path("/x") / spec.executable, 8000, backends)
        start = argv.index("--worker-urls") + 1
        assert argv[start : start + 2] == backends
        assert argv[argv.index("--policy") + 1] == spec.policy
        assert argv[argv.index("--port") + 1] == "8000"
        assert int(argv[argv.index("--prometheus-port") + 1]) > 0
    assert {spec.name: spec.policy for spec in PEERS} == {
        "vllm-router": "round_robin",
        "sglang-router": "cache_aware",
    }


def _installed() -> bool:
    return all((env_dir(spec) / ".meridian-installed").is_file() for spec in PEERS)


@pytest.mark.skipif(not _installed(), reason="peer routers not installed in the cache directory")
def test_tiny_run_with_the_peers_gives_every_router_a_row(
    redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    saved = tmp_path / "proxy.json"
    text = run_command(
        "bench", "proxy", "--peers", "--server", "uvicorn", "--concurrency", "2",
        "--requests", "6", "--idle-window", "0.5", "--idle-settle", "0",
        "--json", str(saved),
    )  # fmt: skip
    data = json.loads(saved.read_text())
    servers = ["uvicorn", "vllm-router", "sglang-router"]
    assert [(r["mode"], r["server"]) for r in data["rows"]] == [
        (mode, server) for mode in ("stream", "nonstream") for server in servers
    ]
    for row in data["rows"]:
        assert row["errors"] == 0, row["first_error"]
        assert row["direct_errors"] == 0, row["direct_first_error"]
        assert row["requests"] == 6
        assert row["balancer_rss_mib"] > 0
    assert sorted(data["meta"]["idle_cpu_cores"]) == sorted(servers)
    assert "idle CPU (cores, nothing sent): uvicorn" in text
    assert "load average" in text
