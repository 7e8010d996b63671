"""The command's side of a measured phase: the generator process and the balancer's usage.

``py_spy_recording`` samples a process's Python stacks with py-spy (needs
ptrace rights, e.g. root) into a collapsed-stack file, for ``--py-spy DIR``.
``LoadGenerator`` owns the ``ops.bench.loadgen`` child: it sends one phase
at a time and waits for its result line.  ``UsageMonitor`` watches a balancer
process with psutil while a phase runs: CPU seconds (user + system, the
process and its threads) between start and stop, and the peak resident set
size sampled every 50 ms from a thread.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from ops.bench.loadgen import Phase

SAMPLE_PERIOD_S = 0.05


class BenchError(RuntimeError):
    """The benchmark cannot go on (a child died, a phase failed to run)."""


class LoadGenerator:
    """The load-generator child process; a context manager that always ends it."""

    def __init__(self, cwd: Path) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "ops.bench.loadgen"],
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C reaches the command, which ends this child
        )

    def run(self, phase: Phase) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(asdict(phase)) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise BenchError(f"the load generator exited ({self._process.poll()})")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            try:
                self._process.stdin.close()
                self._process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._process.kill()
                self._process.wait()

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class UsageMonitor:
    """CPU seconds and peak RSS of one process over one phase."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self._peak = 0
        self._cpu0 = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._cpu0 = self._cpu()
        self._peak = self._process.memory_info().rss
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def stop(self) -> tuple[float, int]:
        """(CPU seconds since ``start``, peak RSS in bytes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self._cpu() - self._cpu0, self._peak

    def _cpu(self) -> float:
        times = self._process.cpu_times()
        return float(times.user + times.system)

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_PERIOD_S):
            try:
                self._peak = max(self._peak, self._process.memory_info().rss)
            except psutil.Error:
                return


@contextlib.contextmanager
def py_spy_recording(pid: int, path: Path, rate: int = 250) -> Iterator[None]:
    """Sample ``pid`` with ``py-spy record`` while the block runs (idle frames left out)."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [binary, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
            "--output", str(path), "--nonblocking"]  # fmt: skip
    recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        # py-spy writes its output when interrupted, as after Ctrl-C.
        recorder.send_signal(signal.SIGINT)
        try:
            _, err = recorder.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            recorder.kill()
            recorder.wait()
            raise BenchError(f"py-spy did not stop for {path}") from None
        if recorder.returncode not in (0, -signal.SIGINT) and not path.exists():
            raise BenchError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
