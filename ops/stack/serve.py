"""Serve the balancer with uvicorn on a port that N processes share (``SO_REUSEPORT``).

uvicorn (0.54) has no reuse-port option, so this binds the socket itself, with
``SO_REUSEPORT`` set before ``bind``, and hands it to ``uvicorn.Server.run``.
Every process started this way on the same host and port gets its own accept
queue, and the kernel spreads new connections among them by a hash of the
4-tuple: N single-threaded event loops behind one address, no front proxy.
The processes share routing state through Redis (docs/scale-out.md).

    python -m ops.stack.serve --host 127.0.0.1 --port 8101

The arguments mirror uvicorn's own (the guarded HTTP protocol, lifespan on, no
access log) so one process started this way behaves as ``ops.stack.plan``'s
plain uvicorn command does.
"""

from __future__ import annotations

import argparse
import socket

APP = "meridian.asgi:application"
BACKLOG = 2048


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` that other processes may bind too."""
    if not hasattr(socket, "SO_REUSEPORT"):
        raise OSError("SO_REUSEPORT is not available on this platform: run one process per port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http", default="routing.http_protocol:GuardedHttpToolsProtocol")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port must be within 1..65535, not {args.port}")
    import uvicorn  # late: --help and argument errors need no server

    sock = reuseport_socket(args.host, args.port)
    config = uvicorn.Config(APP, lifespan="on", http=args.http, access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
