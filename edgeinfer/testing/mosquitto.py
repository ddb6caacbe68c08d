"""A real mosquitto broker on a free loopback port, for tests and smoke checks.

    with Mosquitto() as broker:
        client.connect(broker.host, broker.port)

Each broker gets its own config file and data folder (no persistence unless asked), so tests
never share state with a broker the machine already runs.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Self


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Mosquitto:
    """Start ``mosquitto -c <generated config>``; stop it on exit.

    Args:
        extra_config: more lines for the config (auth, TLS, ACL), written after the listener.
        port: a fixed port (default: a free one), e.g. to restart on the same port.
        binary: the mosquitto executable (default: found on PATH or in /usr/sbin).
    """

    def __init__(self, extra_config: str = "", port: int | None = None,
                 binary: str | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.binary = binary or shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self._extra = extra_config
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> None:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="edgeinfer-mosquitto-")
        folder = Path(self._dir.name)
        conf = folder / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} {self.host}\nallow_anonymous true\n"
            f"persistence_location {folder}/\nlog_dest stderr\n{self._extra}\n"
        )
        self._proc = subprocess.Popen([self.binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                      stderr=open(folder / "log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = (folder / "log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"mosquitto exited with {self._proc.returncode}: {log}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.address} within {timeout_s} s")

    def stop(self, kill: bool = False) -> None:
        """Stop the broker (``kill=True``: SIGKILL, as a crash); ``start()`` brings it back."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
