"""What every helper process of edgeinfer shares: how it is started (``spawn``), how it dies
with its parent, how its log records reach the parent's handlers, and how its end is told in
words (``crashed (SIGSEGV)``).

Used by the backend measurer (``runtime/guarded.py``) and the capture processes
(``sources/isolated.py``). A child is ``python -m <module> <fd>``: one end of a socket pair,
wrapped in a ``multiprocessing.connection.Connection`` on both sides (length-framed messages).
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["Forward", "child_env", "describe_exit", "die_with_parent", "emit_record", "spawn",
           "wait_exit"]

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def spawn(module: str, *, extra_fds: Sequence[int] = ()
          ) -> tuple[subprocess.Popen[bytes], Connection]:
    """Start ``python -m module FD [extra fds...]`` with the parent's environment (and this
    package importable); return the process and the parent's end of the connection.

    Raises:
        OSError: the process could not be started (out of memory or processes).
    """
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with parent, child:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, str(child.fileno()), *map(str, extra_fds)],
            pass_fds=(child.fileno(), *extra_fds), env=child_env(), stdin=subprocess.DEVNULL,
            stdout=2)
        return proc, Connection(parent.detach())


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    return env


def die_with_parent() -> None:
    """In the child: Ctrl-C is the parent's to handle (it ends this child), and a parent that
    dies takes it along (``PR_SET_PDEATHSIG``; elsewhere the closed socket ends the child at
    its next message)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_HEAP_MMAP_THRESHOLD = 32 << 20  # glibc's largest: 32 MiB, a 4K frame and more
_HEAP_TRIM_THRESHOLD = 64 << 20


def keep_frames_in_the_heap() -> bool:
    """In a child that decodes frames and frees each soon after (a capture process): glibc
    allocates them from its heap and keeps the freed pages there, instead of a fresh ``mmap``
    per frame (a page fault per 4 KiB: 146 per 720p frame measured, about 16 % of such a
    process's CPU) or a trimmed heap that faults them in again. The pages held stay bounded
    by the few frames in flight. ``False`` where malloc is not glibc's.

    The daemon's own process does the opposite (``runtime.memory.return_frames_to_the_os``):
    there frames are held across threads for longer, and memory returned matters more."""
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, _HEAP_MMAP_THRESHOLD)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, _HEAP_TRIM_THRESHOLD))
    except (OSError, AttributeError):
        return False


def describe_exit(code: int) -> str:
    """``crashed (SIGSEGV)`` for a signal, ``exited with code 3`` otherwise."""
    if code < 0:
        try:
            return f"crashed ({signal.Signals(-code).name})"
        except ValueError:
            return f"crashed (signal {-code})"
    return f"exited with code {code}"


def wait_exit(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int:
    """The child's exit code, killing it if it does not end within ``timeout``."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class Forward(logging.Handler):
    """In the child: log records sent to the parent as ``("log", record dict)`` (see
    ``emit_record``), so they reach the parent's own handlers."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        super().__init__()
        self._conn = conn
        self._lock = lock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = {"name": record.name, "levelno": record.levelno,
                    "levelname": record.levelname, "msg": record.getMessage(),
                    "created": record.created, "pathname": record.pathname,
                    "lineno": record.lineno, "funcName": record.funcName,
                    "exc_text": self.format(record).partition("\n")[2] if record.exc_info
                    else None}
            with self._lock:
                self._conn.send_bytes(pickle.dumps(("log", data)))
        except Exception:  # the parent is gone, or the record will not pickle
            self.handleError(record)


def emit_record(data: dict[str, Any]) -> None:
    """In the parent: a record the child's ``Forward`` sent, handled by its logger."""
    record = logging.makeLogRecord(data)
    logger = logging.getLogger(record.name)
    if logger.isEnabledFor(record.levelno):
        logger.handle(record)
