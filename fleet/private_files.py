"""Files that hold secrets or user data, created readable by their owner only (0600).

Under ``var/`` live the secret key, the internal token, the admin password and API
key, the SQLite database (prompts' metadata, users, keys' hashes) and the process
logs (request ids, errors).  Created with the process umask they would be 0644:
readable by every account on the machine.  These helpers create them 0600 from the
start (no window in which another user could open them) and tighten a file found
looser.  SQLite gives its ``-wal`` and ``-shm`` files the database file's mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

PRIVATE = 0o600


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (replacing it), readable by the owner only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE)
    with os.fdopen(descriptor, "w") as file:
        os.fchmod(file.fileno(), PRIVATE)  # an existing file keeps its mode otherwise
        file.write(text)


def ensure_private(path: Path) -> None:
    """``path`` exists (empty if new) and is readable by the owner only."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE)
    try:
        os.fchmod(descriptor, PRIVATE)
    finally:
        os.close(descriptor)


def open_private_log(path: Path) -> BinaryIO:
    """``path`` opened to append, created (or tightened to) 0600."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE)
    os.fchmod(descriptor, PRIVATE)
    return os.fdopen(descriptor, "ab")
