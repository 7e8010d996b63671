"""N processes per balancer in the demo stack's plan, and the SO_REUSEPORT launcher."""

from __future__ import annotations

import socket

import pytest

from ops.demo import plan_demo
from ops.stack.plan import balancer_specs
from ops.stack.serve import main, reuseport_socket


def test_each_balancer_gets_n_processes_on_its_one_port() -> None:
    topology = plan_demo("127.0.0.1", 18100, 18200)
    specs = balancer_specs(topology, "uvicorn", processes=2)
    assert len(specs) == 2 * len(topology.balancers)
    for balancer in topology.balancers:
        mine = [s for s in specs if s.env["MERIDIAN_BALANCER"] == balancer.name]
        assert [s.name for s in mine] == [balancer.name, f"{balancer.name}#2"]
        assert all("ops.stack.serve" in s.argv and str(balancer.port) in s.argv for s in mine)
    single = balancer_specs(topology, "daphne")
    assert [s.name for s in single] == [b.name for b in topology.balancers]


def test_bad_process_counts_are_refused() -> None:
    topology = plan_demo("127.0.0.1", 18100, 18200)
    with pytest.raises(ValueError, match="at least 1"):
        balancer_specs(topology, "uvicorn", processes=0)
    with pytest.raises(ValueError, match="need uvicorn"):
        balancer_specs(topology, "daphne", processes=2)


def test_two_sockets_bind_one_port_and_the_kernel_spreads_connections() -> None:
    first = reuseport_socket("127.0.0.1", 0)
    port = first.getsockname()[1]
    second = reuseport_socket("127.0.0.1", port)
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(32)]
    accepted = {}
    try:
        for name, listener in (("first", first), ("second", second)):
            listener.settimeout(0.0)
            accepted[name] = 0
            while True:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    break
                conn.close()
                accepted[name] += 1
    finally:
        for sock in (*clients, first, second):
            sock.close()
    # By a hash of each connection's ports: 32 all on one socket has odds of 2**-31.
    assert sum(accepted.values()) == 32 and min(accepted.values()) > 0, accepted


def test_the_launcher_refuses_a_bad_port() -> None:
    with pytest.raises(SystemExit):
        main(["--port", "70000"])
