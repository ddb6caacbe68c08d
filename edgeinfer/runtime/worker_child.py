"""The worker process of ``isolation: process``: ``python -m edgeinfer.runtime.worker_child FD``.

It receives the region's memfd and the spec over the socket, caps its address space, opens the
session and answers ``run`` messages until the parent says ``close`` or goes away. See
``worker.py`` for the protocol and the measured address-space headroom.
"""

from __future__ import annotations

import errno
import mmap
import resource
import signal
import socket
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from ..errors import ModelMemoryError
from .base import SessionSpec
from .shm import MIB, Meta, copy_in, layout, resize, unmap, view

_ARENA_MB = 64 if sys.maxsize > 2**32 else 1  # glibc HEAP_MAX_SIZE
# Imported before the child measures its baseline; the first that imports is enough.
_RUNTIMES = {"onnx": ("onnxruntime",),
             "tflite": ("ai_edge_litert.interpreter", "tflite_runtime.interpreter")}
# Words in an error that mean an allocation failed (onnxruntime, LiteRT, the C++ runtime).
OOM_MARKERS = ("bad_alloc", "bad allocation", "failed to allocate", "out of memory",
               "cannot allocate memory", "available memory of")


def _headroom_mb(threads: int) -> float:
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack_mb = 32.0 if soft == resource.RLIM_INFINITY else soft / MIB + 0.1  # + guard page
    arenas = 1 if threads <= 1 else 2  # no pool threads: at most one stray thread mallocs
    return (max(threads, 1) + 2) * stack_mb + arenas * _ARENA_MB + 32


def _error_reply(exc: BaseException) -> tuple[Any, ...]:
    is_memory, cause = False, exc
    for _ in range(8):  # the chain, bounded
        is_memory = isinstance(cause, (MemoryError, ModelMemoryError)) or (
            isinstance(cause, OSError) and cause.errno == errno.ENOMEM
        ) or any(marker in str(cause).lower() for marker in OOM_MARKERS)
        nxt = cause.__cause__ or cause.__context__
        if is_memory or nxt is None:
            break
        cause = nxt
    return ("error", is_memory, type(exc).__name__, str(exc), traceback.format_exc())


class _Child:
    """The worker's side of the region, and its address-space limit without the region."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.mm: mmap.mmap | None = None
        self.limit: int | None = None
        self.session: Any = None

    def remap(self, need: int) -> None:
        size = resize(self.fd, need)
        unmap(self.mm)
        self.mm = None
        if self.limit is not None:
            # Soft limit only: the region is ours to grow, the model's share stays fixed.
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            soft = self.limit + size
            if hard != resource.RLIM_INFINITY:
                soft = min(soft, hard)
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        self.mm = mmap.mmap(self.fd, size)

    def load(self, spec: SessionSpec, limit_mb: float | None, size: int) -> dict[str, Any]:
        for name in _RUNTIMES.get(spec.format, ()):
            try:
                __import__(name)
                break
            except ImportError:
                continue  # open_session raises BackendUnavailableError for it
        from . import open_session
        from .memory import vm_size_mb

        rlimit_mb = None
        if limit_mb is not None:
            rlimit_mb = round(vm_size_mb() + limit_mb + _headroom_mb(spec.threads))
            self.limit = rlimit_mb * MIB
        self.remap(size)
        self.session = open_session(spec)
        return {"inputs": self.session.inputs, "outputs": self.session.outputs,
                "provider": self.session.provider, "report": self.session.report,
                "quantization": getattr(self.session, "quantization", "unknown"),
                "rlimit_mb": rlimit_mb}

    def run(self, size: int, metas: list[Meta], inline: dict[str, Any]) -> tuple[Any, ...]:
        if self.mm is None or size != len(self.mm):
            self.remap(size)
        feeds = {name: view(self.mm, d, s, off) for name, d, s, off in metas}
        _, _, end = layout(feeds, 0)  # the same offsets the parent chose
        feeds.update(inline)
        results = self.session.run(feeds)
        del feeds  # so that a remap below can unmap the old region
        out_metas, out_inline, out_end = layout(results, end)
        if self.mm is None or out_end > len(self.mm):
            self.remap(out_end)
        assert self.mm is not None
        copy_in(self.mm, out_metas, results)
        return ("ok", len(self.mm), out_metas, out_inline, out_end)


def _serve(sock_fd: int) -> int:
    """The worker's main loop: load, then answer ``run`` until ``close`` or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sock = socket.socket(fileno=sock_fd)
    _, fds, _, _ = socket.recv_fds(sock, 1, 1)
    conn = Connection(sock.detach())
    child = _Child(fds[0])
    try:
        conn.send(("ok", child.load(*conn.recv()[1:])))
    except Exception as exc:
        conn.send(_error_reply(exc))
        return 1
    try:
        while (msg := conn.recv())[0] == "run":
            try:
                reply = child.run(*msg[1:])
            except Exception as exc:
                reply = _error_reply(exc)
            conn.send(reply)
    except EOFError:  # the parent is gone
        pass
    finally:
        child.session.close()  # the runtime's own cleanup; the region dies with the process
    return 0


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
