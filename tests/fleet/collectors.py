"""What the fleet tests share: `edgeinfer collect` as a real subprocess, watched through its
metrics endpoint, and a bounded wait."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait(predicate: Callable[[], bool], timeout: float,
         why: Callable[[], str] = lambda: "") -> None:
    """Poll ``predicate`` until true; after ``timeout`` s fail with ``why()``'s tail."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out; {why()[-3000:]}")
        time.sleep(0.1)


class CollectorProcess:
    """``edgeinfer collect -c CONFIG`` with its metrics on ``metrics``; stderr to a log file."""

    def __init__(self, config: Path, metrics: int, connect_s: float = 30.0) -> None:
        self.config, self.metrics, self.connect_s = config, metrics, connect_s
        self.proc: subprocess.Popen[str] | None = None
        self.log = config.with_suffix(".log")

    def start(self) -> None:
        self.log = self.config.with_suffix(f".{time.monotonic_ns()}.log")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer", "collect", "-c", str(self.config)],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), text=True)  # noqa: SIM115
        wait(lambda: self.scrape().get("edgeinfer_collect_source_connected") == 1.0,
             self.connect_s, lambda: self.log.read_text())

    def scrape(self) -> dict[str, float]:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/metrics",
                                          timeout=2).read().decode()
        except OSError:
            return {}
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def terminate(self) -> dict[str, Any]:
        """SIGTERM; the exit must be clean. Returns the summary line's counters."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(20) == 0, self.log.read_text()[-3000:]
        last = [line for line in self.log.read_text().splitlines()
                if line.startswith("edgeinfer collect: {")][-1]
        summary: dict[str, Any] = json.loads(last.split(": ", 1)[1])
        return summary
