"""The child side of ``taskrun.task_in_worker``: ``python -m edgeinfer.ota.task_child FD``.

It reads one pickled ``TaskRequest`` from the socket ``FD``, lowers its priority, imports the
runtime, caps its address space (soft ``RLIMIT_AS``: what is mapped after the imports, plus the
trial's memory limit, plus the runtime's own reservations, as the trial worker does), loads the
candidate in this process and runs the pipeline's task on one synthetic frame. It answers
``("ok", TaskTrial)`` or ``("rejected", reason, message)``; the parent kills it on timeout.
"""

from __future__ import annotations

import os
import pickle
import resource
import signal
import socket
import sys
from multiprocessing.connection import Connection
from typing import Any

from ..errors import EdgeInferError, ModelMemoryError, OtaRejected
from ..model.load import load_model
from ..pipeline.build import task_load_options
from ..runtime.memory import vm_size_mb
from .taskrun import TaskRequest, TaskTrial, run_task
from .watchdog import TrialWatchdog, rejection_for

_MIB = 1 << 20
_ARENA_MB = 64.0


def _headroom_mb(threads: int) -> float:
    # The trial worker's measured formula (runtime/worker.py): a stack per pool thread, two
    # glibc arenas (MALLOC_ARENA_MAX=2) and 32 MiB of libraries mapped at session creation.
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack_mb = 32.0 if soft == resource.RLIM_INFINITY else soft / _MIB + 0.1
    return (max(threads, 1) + 2) * stack_mb + 2 * _ARENA_MB + 32


def _limit(limit_mb: float | None, threads: int) -> None:
    if limit_mb is None:
        return
    soft = int((vm_size_mb() + limit_mb + _headroom_mb(threads)) * _MIB)
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _is_memory(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    for _ in range(8):  # the chain, bounded
        if cause is None:
            return False
        if isinstance(cause, (MemoryError, ModelMemoryError)):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _trial(request: TaskRequest) -> TaskTrial:
    try:  # mapped before the limit is measured, as in the trial worker
        import onnxruntime  # noqa: F401
    except ImportError:  # a TFLite-only device: the load imports its own runtime
        pass

    pc, runtime = request.pipeline, request.runtime
    kwargs: dict[str, Any] = pc.model.load_kwargs(default_max_model_mb=runtime.max_model_mb)
    for key, value in task_load_options(pc, request.path).items():
        if not kwargs.get(key):  # what the config says explicitly wins, as in assembly
            kwargs[key] = value
    for key in [k for k in kwargs if k.startswith("worker_")]:
        del kwargs[key]
    kwargs.update(isolation="none", memory_limit_mb=None, probe=False)
    _limit(request.memory_limit_mb, int(kwargs.get("threads") or os.cpu_count() or 1))
    model = load_model(request.path, **kwargs, state_dir=runtime.resolved_state_dir(),
                       cache_dir=runtime.resolved_cache_dir(), optimized_model_cache=False)
    try:
        tag, feeds, outputs = run_task(model, pc)
    finally:
        model.close()
    return TaskTrial(tag, feeds, {k: list(v.shape) for k, v in outputs.items()})


def _answer(request: TaskRequest) -> tuple[Any, ...]:
    tag = str(type(request.pipeline.task).__struct_config__.tag)
    try:
        return ("ok", _trial(request))
    except OtaRejected as exc:
        if _is_memory(exc):
            return _out_of_memory(request, tag, exc.__cause__ or exc)
        return ("rejected", exc.reason, str(exc))
    except Exception as exc:  # the candidate's own code path: every failure is its refusal
        if _is_memory(exc):
            return _out_of_memory(request, tag, exc)
        if isinstance(exc, EdgeInferError):
            rej = rejection_for(exc, TrialWatchdog(0.0), request.memory_limit_mb)
            return ("rejected", rej.reason, str(rej))
        return ("rejected", "undecodable", f"building the {tag} task for the candidate failed: "
                                           f"{type(exc).__name__}: {exc}")


def _out_of_memory(request: TaskRequest, tag: str, exc: BaseException) -> tuple[Any, ...]:
    limit = request.memory_limit_mb
    within = f"its limit of {limit:g} MiB (ota.verify.memory_limit_mb)" if limit is not None \
        else "the memory there was"
    return ("rejected", "out_of_memory",
            f"building the {tag} task for the candidate needed more memory than {within}: "
            f"{type(exc).__name__} {exc}".rstrip())


def main(sock_fd: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(socket.socket(fileno=sock_fd).detach())
    request: TaskRequest = pickle.loads(conn.recv_bytes())
    if request.nice:
        os.nice(request.nice)
    conn.send_bytes(pickle.dumps(_answer(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
