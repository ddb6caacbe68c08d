"""A throwaway PostgreSQL cluster on a free loopback port, for tests and benchmarks.

    with Postgres(tmp_path / "pg") as pg:
        conn = psycopg.connect(pg.dsn)

``initdb --auth=trust`` makes a cluster in ``folder`` (never the machine's own one on 5432);
the postmaster listens on 127.0.0.1 and a socket folder of its own. ``fsync`` stays on: the
exactly-once tests kill the server with -9 (`kill`) and count on what was committed before.
As root (initdb refuses root) the cluster is made and run as the ``postgres`` user in a private
folder under the system's temp folder (pytest's own folders are closed to other users); it is
removed with the cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from .._net import free_port
from .procs import stop_process

__all__ = ["BIN_DIR", "Postgres", "available"]

BIN_DIR = Path(os.environ.get("EDGEINFER_PG_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> bool:
    """Whether the PostgreSQL server binaries this harness runs are installed."""
    return all((BIN_DIR / name).is_file() for name in ("initdb", "postgres", "pg_isready"))


class Postgres:
    """One throwaway cluster; ``start()`` makes it on first use.

    Args:
        folder: Where the cluster, its sockets and its log live (made if missing).
        port: A fixed port (default: a free one); restarts keep it.
    """

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self._private: Path | None = None
        self._user: str | None = None
        if os.geteuid() == 0:
            self._user = "postgres"
            self._private = Path(tempfile.mkdtemp(prefix="edgeinfer-pg-"))
            folder = self._private
            entry = pwd.getpwnam(self._user)
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        """The cluster's data folder."""
        return self.folder / "data"

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` database as the superuser."""
        user = self._user or pwd.getpwuid(os.geteuid()).pw_name
        return f"host={self.host} port={self.port} user={user} dbname=postgres"

    @property
    def log(self) -> str:
        """What the server wrote to its log so far."""
        path = self.folder / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float = 30.0) -> None:
        """Make the cluster (first time) and start the postmaster; returns when it accepts
        connections. A start right after `kill` waits for the dead server's backends to go."""
        if not (self.data / "PG_VERSION").exists():
            self._run([str(BIN_DIR / "initdb"), "-D", str(self.data), "--auth=trust",
                       "-U", self._user or pwd.getpwuid(os.geteuid()).pw_name,
                       "--no-sync", "-E", "UTF8", "--locale=C"])
        deadline = time.monotonic() + timeout_s
        while True:
            self._spawn()
            if self._wait_ready(deadline):
                return
            if time.monotonic() >= deadline:
                self.stop(kill=True)
                raise RuntimeError(f"postgres did not start in {timeout_s} s: {self.log[-2000:]}")
            time.sleep(0.2)  # e.g. the killed server's shared memory is still held

    def stop(self, kill: bool = False) -> None:
        """Stop the server (fast shutdown; ``kill=True``: SIGKILL of all its processes)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if kill and proc.poll() is None:
            # The whole server at once, as a crash of its machine or container: a backend
            # left alone would go on serving its client until it next checks its postmaster.
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.poll() is None:
            # SIGTERM is a "smart" shutdown that waits for every client to leave; SIGINT is
            # the "fast" one (clients cut, then a clean checkpoint).
            proc.send_signal(signal.SIGINT)
        stop_process(proc, 20, kill=kill)

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (its process group), as a crash."""
        self.stop(kill=True)

    def restart(self, kill: bool = False) -> None:
        """Stop (or kill) and start again on the same port with the same data."""
        self.stop(kill=kill)
        self.start()

    def _spawn(self) -> None:
        log = open(self.folder / "postgres.log", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self._proc = subprocess.Popen(
                [str(BIN_DIR / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-c", f"listen_addresses={self.host}", "-k", str(self.folder),
                 "-c", "shared_buffers=16MB", "-c", "max_connections=40",
                 "-c", "fsync=on", "-c", "synchronous_commit=on"],
                stdout=log, stderr=log, start_new_session=True, **self._as_user())
        finally:
            log.close()

    def _wait_ready(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = None
                return False
            ready = subprocess.run(
                [str(BIN_DIR / "pg_isready"), "-q", "-h", self.host, "-p", str(self.port)],
                check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if ready.returncode == 0:
                return True
            time.sleep(0.05)
        return False

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, check=False, capture_output=True, **self._as_user())
        if done.returncode:
            raise RuntimeError(f"{argv[0]} failed: {done.stderr.decode(errors='replace')}")

    def _as_user(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        return {"user": self._user, "group": self._user, "extra_groups": [],
                "cwd": str(self.folder)}

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._private is not None:
            shutil.rmtree(self._private, ignore_errors=True)
            self._private = None
