"""Load on the machine for tests that must hold under it: bounded busy-loop processes."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Each hog spins for at most this long even if the test never stops it.
HOG_LIMIT_S = 120


@contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """``processes`` busy loops at normal priority for the duration of the block."""
    spin = (
        f"import time\nend = time.monotonic() + {HOG_LIMIT_S}\nwhile time.monotonic() < end: pass"
    )
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(processes)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
