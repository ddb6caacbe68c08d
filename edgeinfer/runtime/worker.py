"""``isolation: process``: a session in a worker subprocess, so a crash or OOM cannot take us down.

The parent starts ``python -m edgeinfer.runtime.worker_child FD`` (not multiprocessing: spawn re-runs
the user's ``__main__``, and fork after onnxruntime started its threads is unsafe) and talks to it
over a ``socketpair``: pickled control messages through ``multiprocessing.connection.Connection``,
tensors through one ``memfd`` region mapped on both sides. A call lays out its inputs, then its
outputs, at 64-byte-aligned offsets: the parent copies the inputs in, the child runs on views of
them and writes the outputs after them, the parent copies the outputs out. Whichever side needs
more room grows the memfd; the other remaps when it sees the new size. A memfd vanishes with its
last holder, so a killed worker leaves nothing in ``/dev/shm``.

The child caps its address space (soft ``RLIMIT_AS``) once the runtime is imported::

    limit = VmSize after import + memory_limit_mb + headroom(threads) + region size

RLIMIT_AS counts reservations, not use; the headroom pays for what the runtime reserves on its own.
Measured on x86_64 (glibc 2.36, onnxruntime 1.31, ``MALLOC_ARENA_MAX=2``, 146 MiB after import,
a 0.25 MiB model), VmSize grew by 12 MiB with 1 thread, 86 with 2, 102 with 4, 135 with 8, 201
with 16: an ``RLIMIT_STACK`` stack (8 MiB) per pool thread, and a 64 MiB glibc arena for the first
thread that mallocs; at 8 threads a second arena appeared transiently (glibc's cap races). So:
``(threads + 2) x stack + 2 x 64 MiB + 32 MiB`` for libraries mapped at session creation (one arena
with 1 thread): 120 MiB for 1 thread, 208 for 4. With ``memory_limit_mb=64``, a model whose
output is 64 MiB ran, one of 96 MiB failed to allocate (1 and 4 threads alike). GPU providers
reserve far more address space: give them ``memory_limit_mb=None``.
"""

from __future__ import annotations

import logging
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Self

import numpy as np

from .. import errors
from ..errors import (
    EdgeInferError,
    InferenceError,
    ModelLoadError,
    ModelMemoryError,
    StateError,
    WorkerCrashedError,
)
from .base import LoadReport, SessionSpec, TensorSpec
from .shm import MIB, align, copy_in, layout, resize, unmap, view

__all__ = ["WorkerSession"]

logger = logging.getLogger(__name__)

_WAIT_S = 2.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# How native code that ignores a failed allocation usually dies.
_ALLOC_SIGNALS = {signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS}


class WorkerSession:
    """A model session in its own process, under an address-space limit (the ``Session`` protocol).

    A worker that dies (segfault, OOM kill, ``kill -9``) or overruns ``run_timeout_s`` makes
    ``run`` raise ``WorkerCrashedError`` until ``restart()`` starts a fresh one. One call is in
    flight at a time; concurrent callers wait their turn.

    Args:
        spec: what to load; the worker calls ``edgeinfer.runtime.open_session(spec)``.
        memory_limit_mb: the model's share of the worker's ``RLIMIT_AS``; ``None``: no limit.
        start_timeout_s: loading and warming up longer than this kills the worker.
        run_timeout_s: a ``run`` longer than this kills the worker; ``None``: no limit.
        nice: added to the worker's scheduling niceness (a background job, such as checking a
            model update, must not slow the pipelines down).

    Raises:
        ModelLoadError, ModelMemoryError: the worker could not load the model (an
            ``EdgeInferError`` the backend raised keeps its class).
        WorkerCrashedError: the worker died or timed out while loading.
    """

    def __init__(
        self,
        spec: SessionSpec,
        memory_limit_mb: float | None,
        *,
        start_timeout_s: float = 60,
        run_timeout_s: float | None = None,
        nice: int = 0,
    ) -> None:
        self._spec, self._limit_mb, self._nice = spec, memory_limit_mb, nice
        self._start_timeout_s, self._run_timeout_s = start_timeout_s, run_timeout_s
        self._lock = threading.Lock()
        self._closed = False
        self._dead: str | None = None  # why the worker is unusable, until restart()
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._out_bytes = 0
        self.inputs: tuple[TensorSpec, ...] = ()
        self.outputs: tuple[TensorSpec, ...] = ()
        self.report = LoadReport()
        self.quantization = "unknown"
        self._provider = ""
        self._start()

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def pid(self) -> int | None:
        """The worker's process id; ``None`` once closed."""
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the worker is running and usable."""
        return self._dead is None and self._proc is not None and self._proc.poll() is None

    @property
    def region_bytes(self) -> int:
        """Size of the shared tensor region; it grows to fit the largest call so far."""
        return 0 if self._mm is None else len(self._mm)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model in the worker on feeds already checked by ``check_feeds``.

        Raises:
            WorkerCrashedError: the worker died, or timed out and was killed; see ``restart``.
            InferenceError, ModelMemoryError: the runtime failed; the worker keeps serving.
            StateError: the session is closed.
        """
        with self._lock:
            if self._closed:
                raise StateError("this worker session is closed")
            if self._dead is not None:
                raise self._crash_error()
            metas, inline, end = layout(feeds, 0)
            # Room for the last call's outputs too, so the worker seldom grows the region itself.
            if align(end) + self._out_bytes > self.region_bytes:
                self._remap(align(end) + self._out_bytes)
            copy_in(self._mm, metas, feeds)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("worker %s: run with %d input bytes", self.pid, end)
            try:
                self._send(("run", self.region_bytes, metas, inline), "running the model")
                reply = self._receive(self._run_timeout_s, "running the model")
            except BaseException as exc:
                if not isinstance(exc, EdgeInferError):
                    self._abandon(exc)
                raise
            if reply[0] != "ok":
                raise self._remote_error(reply, InferenceError)
            _, size, out_metas, out, out_end = reply
            if size != self.region_bytes:
                self._remap(size)
            for name, dtype, shape, off in out_metas:
                out[name] = view(self._mm, dtype, shape, off).copy()
            self._out_bytes = max(0, out_end - align(end))
            return out  # type: ignore[no-any-return]

    def restart(self) -> None:
        """Stop the worker, dead or alive, and start a fresh one (same spec, new region).

        Raises:
            StateError: the session is closed.
            ModelLoadError, WorkerCrashedError: as the constructor.
        """
        with self._lock:
            if self._closed:
                raise StateError("cannot restart a closed worker session")
            self._stop()
            self._start()

    def close(self) -> None:
        """Ask the worker to exit (then terminate, then kill it) and free the region. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self._lock.acquire(timeout=_WAIT_S):
            # A run is in flight and may never return: killing the worker wakes it up.
            proc = self._proc
            if proc is not None and proc.poll() is None:
                proc.kill()
            self._lock.acquire()
        try:
            self._stop()
        finally:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _start(self) -> None:
        self._dead, self._out_bytes = None, 0
        try:
            self._fd = os.memfd_create("edgeinfer-worker", os.MFD_CLOEXEC)
            self._remap(MIB)
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            with parent, child:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "edgeinfer.runtime.worker_child", str(child.fileno())],
                    pass_fds=(child.fileno(),), env=_child_env(), stdin=subprocess.DEVNULL,
                    stdout=2,  # our stderr: a pipe nobody reads would block the worker
                )
                if self._nice:  # set before the child imports the runtime and starts threads
                    os.setpriority(os.PRIO_PROCESS, self._proc.pid,
                                   os.getpriority(os.PRIO_PROCESS, 0) + self._nice)
                socket.send_fds(parent, [b"m"], [self._fd])
                self._conn = Connection(parent.detach())
            msg = ("load", self._spec, self._limit_mb, self.region_bytes)
            self._send(msg, "loading the model")
            reply = self._receive(self._start_timeout_s, "loading the model")
            if reply[0] != "ok":
                raise self._remote_error(reply, ModelLoadError)
        except BaseException:
            self._stop()
            self._dead = self._dead or "the worker could not be started"
            raise
        info: dict[str, Any] = reply[1]
        self.inputs, self.outputs = info["inputs"], info["outputs"]
        self._provider, self.quantization = info["provider"], info["quantization"]
        self.report = info["report"]
        self.report.isolation = "process"
        rlimit = info["rlimit_mb"]
        logger.info("worker %d loaded %s on %s, address-space limit %s", self._proc.pid,
                    self._spec.path, self._provider, f"{rlimit} MiB" if rlimit else "off")

    def _stop(self) -> None:
        proc, conn = self._proc, self._conn
        if proc is not None and proc.poll() is None:
            try:
                if conn is not None:
                    conn.send(("close",))
                proc.wait(_WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                proc.terminate()
                try:
                    proc.wait(_WAIT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if conn is not None:
            conn.close()
        if self._mm is not None:
            self._mm.close()
        if self._fd >= 0:
            os.close(self._fd)
        self._proc, self._conn, self._mm, self._fd = None, None, None, -1

    def _remap(self, need: int) -> None:
        size = resize(self._fd, need)
        unmap(self._mm)
        self._mm = None
        self._mm = mmap.mmap(self._fd, size)

    def _send(self, msg: tuple[Any, ...], doing: str) -> None:
        assert self._conn is not None
        try:
            self._conn.send(msg)
        except ConnectionError:
            raise self._died(doing) from None

    def _receive(self, timeout: float | None, doing: str) -> Any:
        assert self._conn is not None and self._proc is not None
        try:
            if timeout is None or self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, ConnectionError):
            pass
        else:
            self._proc.kill()
            self._dead = f"worker {self._proc.pid} timed out after {timeout:g} s {doing}"
        raise self._died(doing) from None

    def _died(self, doing: str) -> EdgeInferError:
        assert self._proc is not None
        try:
            rc = self._proc.wait(_WAIT_S)
        except subprocess.TimeoutExpired:  # the socket broke but the process lingers
            self._proc.kill()
            rc = self._proc.wait()
        if self._dead is None:
            how = f"exited with code {rc}"
            if rc < 0:
                how = f"killed by {_signal_name(-rc)}"
                if self._limit_mb is not None and -rc in _ALLOC_SIGNALS:
                    how += f" (a failed allocation under memory_limit_mb={self._limit_mb:g}?)"
            self._dead = f"worker {self._proc.pid} {how} while {doing}"
        logger.warning("%s", self._dead)
        if self._closed:
            return StateError("the worker session was closed while a call was in flight")
        return self._crash_error()

    def _abandon(self, exc: BaseException) -> None:
        # Its late reply would answer the next call: the worker cannot be trusted any more.
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait()
        self._dead = f"worker {self._proc.pid} was killed: a call was interrupted by {exc!r}"

    def _crash_error(self) -> WorkerCrashedError:
        return WorkerCrashedError(f"{self._dead}; call restart()")

    def _remote_error(self, reply: tuple[Any, ...], default: type[EdgeInferError]) -> Exception:
        _, is_memory, cls_name, message, tb = reply
        cls = getattr(errors, cls_name, None)
        err: EdgeInferError
        if is_memory:
            limit = "none" if self._limit_mb is None else f"{self._limit_mb:g}"
            err = ModelMemoryError(
                f"the model ran out of memory in its worker (memory_limit_mb={limit}): {message}"
            )
        elif isinstance(cls, type) and issubclass(cls, EdgeInferError):
            err = cls(message)
        else:
            err = default(f"{cls_name}: {message}")
        err.add_note("in the worker process:\n" + tb)
        return err


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["MALLOC_ARENA_MAX"] = "2"  # each glibc arena reserves 64 MiB of the address-space limit
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # the worker does no BLAS work of its own
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    return env


