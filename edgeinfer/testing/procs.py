"""Ending the real processes tests start (brokers, stream servers, daemons)."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["stop_process"]


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 10.0, *,
                 kill: bool = False) -> None:
    """SIGTERM ``proc`` (SIGKILL with ``kill``, as a crash) and reap it; a process still there
    after ``timeout_s`` is killed. One that already exited is only reaped."""
    if proc.poll() is None:
        if kill:
            proc.kill()
        else:
            proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)
