"""The console's channel layer: channels-redis with a blocking read shorter than the
socket timeout.

channels-redis waits for a consumer's next message with ``BZPOPMIN`` of
``brpop_timeout`` seconds (5), and redis-py's default socket timeout is also 5 s, so
an idle consumer raced the two: the reply to an empty wait arrived just as the socket
timed out, the consumer died with ``redis.exceptions.TimeoutError`` and the browser's
socket closed with 1011.  A 1 s blocking read answers well inside the socket timeout
even on a loaded machine; an idle consumer pays one cheap round trip a second.
"""

from __future__ import annotations

from channels_redis.core import RedisChannelLayer


class ConsoleChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    brpop_timeout = 1
