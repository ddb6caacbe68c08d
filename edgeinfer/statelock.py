"""One process per state directory: an exclusive ``flock`` on ``<state_dir>/edgeinfer.lock``.

    with StateLock(state_dir / LOCK_NAME):   # AlreadyRunningError if another process holds it
        ...                                  # the outbox, the model store, probe decisions

The lock file says who holds it (pid, host, command line, since when) so that a second daemon
refuses with a message naming the first. The kernel drops a ``flock`` when its holder dies
(``kill -9``, the OOM killer), so a stale lock file never keeps a restarted daemon out: only a
live holder counts, whatever the file still says.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Self

from .errors import AlreadyRunningError, StorageError

__all__ = ["LOCK_NAME", "StateLock"]

LOCK_NAME = "edgeinfer.lock"


def _describe(owner: dict[str, Any]) -> str:
    if not owner:
        return "another process (it has not written its name yet)"
    text = f"pid {owner.get('pid', '?')}"
    if owner.get("host") and owner["host"] != socket.gethostname():
        text += f" on {owner['host']}"
    if owner.get("cmdline"):
        text += f" ({owner['cmdline']})"
    since = owner.get("since")
    if isinstance(since, (int, float)) and 0 < since < 2**31:  # the file is only informative
        text += f", since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
    return text


def _cmdline() -> str:
    try:  # what ps shows: "python3 -m edgeinfer run -c x.yaml" rather than ".../__main__.py"
        args = [a.decode(errors="replace")
                for a in Path("/proc/self/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        args = list(sys.argv)
    if args:
        args[0] = os.path.basename(args[0])
    return " ".join(args)


class StateLock:
    """An exclusive, non-blocking lock held by this process until ``release`` (or its death).

    Args:
        path: The lock file; its folder is created.
        what: What the lock protects, for the error message (default: the folder).
        remedy: What to do instead, for the error message (default: another state directory).

    Raises (from ``acquire``):
        AlreadyRunningError: another process holds it; the message names that process.
        StorageError: the lock file cannot be created (read-only or full file system).
    """

    def __init__(self, path: str | Path, *, what: str | None = None,
                 remedy: str = "its own state directory (runtime.state_dir)") -> None:
        self.path = Path(path)
        self.what = what or f"state directory {self.path.parent}"
        self.remedy = remedy
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> Self:
        import fcntl

        if self._fd is not None:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot create the lock file {self.path}: "
                               f"{exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            owner = self._read_owner(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(f"cannot lock {self.path}: {exc.strerror or exc}") from exc
            raise AlreadyRunningError(
                f"the {self.what} is in use by {_describe(owner)}; stop that process, or give "
                f"this one {self.remedy} (lock: {self.path})"
            ) from None
        try:
            self._write_owner(fd)
        except OSError as exc:  # a full disk: the lock holds all the same, only unnamed
            if exc.errno != errno.ENOSPC:
                os.close(fd)
                raise StorageError(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        self._fd = fd
        return self

    def release(self) -> None:
        """Give the lock up (idempotent). The file stays: removing it would race with a process
        that opened it and waits to lock it."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock

    @staticmethod
    def owner(path: str | Path) -> dict[str, Any]:
        """What the lock file at ``path`` says about its holder (``{}`` if nothing readable)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return {}
        try:
            return StateLock._read_owner(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _read_owner(fd: int) -> dict[str, Any]:
        try:
            data = os.pread(fd, 4096, 0)
            owner = json.loads(data) if data.strip() else {}
        except (OSError, ValueError):
            return {}
        return owner if isinstance(owner, dict) else {}

    @staticmethod
    def _write_owner(fd: int) -> None:
        data = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                           "cmdline": _cmdline()[:300], "since": round(time.time(), 3)}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data + b"\n", 0)

    def __enter__(self) -> Self:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
