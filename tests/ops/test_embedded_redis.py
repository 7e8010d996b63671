from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

from ops.embedded_redis import RedisUnavailableError, ensure_redis, redis_answers
from tests.support.processes import free_port


def test_existing_redis_is_used_as_is(redis_server) -> None:  # type: ignore[no-untyped-def]
    handle = ensure_redis(redis_server.url, data_dir=Path("/nonexistent"))
    assert not handle.embedded
    handle.stop()
    assert redis_answers(redis_server.url)


def test_embedded_redis_starts_where_none_answers_and_stops(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    assert not redis_answers(url)
    handle = ensure_redis(url, data_dir=tmp_path)
    try:
        assert handle.embedded
        client = redis.Redis.from_url(url)
        client.set("meridian:test", "1")
        assert client.get("meridian:test") == b"1"
        client.close()
    finally:
        handle.stop()
    assert not redis_answers(url)


def test_a_port_held_by_something_else_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(RedisUnavailableError, match="not Redis"):
            ensure_redis(f"redis://127.0.0.1:{port}/0", data_dir=tmp_path)
