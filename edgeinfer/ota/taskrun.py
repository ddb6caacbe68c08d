"""The task step of a trial run: one synthetic frame through the pipeline's task, as the pipeline
does it (``make_task``, ``preprocess``, ``inject_state``, the model, ``update_state``,
``postprocess``), and ``task_in_worker``, which does that for an OTA candidate in a subprocess
under the trial's limits (``docs/ota.md``, "Verification").

A candidate's task build reads its metadata, picks a decoder and checks shapes: code driven by
the file's contents. It runs in ``python -m edgeinfer.ota.task_child``, niced, with the
candidate loaded in that process under the same address-space limit as the trial worker and the
time the trial has left; past either the child is killed and the candidate refused
(``out_of_memory``, ``timeout``). The daemon only receives the feeds (what the speed check
times) and the output shapes.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InferenceError, InvalidInputError, OtaRejected, WorkerCrashedError

if TYPE_CHECKING:
    from ..config import PipelineConfig, RuntimeConfig
    from ..frames import Frame
    from ..model.model import Model
    from ..tasks import Task

__all__ = ["TaskRequest", "TaskTrial", "check_finite", "run_task", "synthetic_frame",
           "task_in_worker"]

_DEFAULT_SIZE = (640, 480)  # width, height of an image source that configures none
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# How native code that ignores a failed allocation under RLIMIT_AS usually dies.
_ALLOC_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS)


@dataclass(frozen=True, slots=True)
class TaskRequest:
    """What the child needs: the candidate, its pipeline and the limits."""

    path: Path
    pipeline: PipelineConfig
    runtime: RuntimeConfig
    memory_limit_mb: float | None
    nice: int


@dataclass(frozen=True, slots=True)
class TaskTrial:
    """What the task step gave: the task's tag, the feeds the model got (state included) and
    the output shapes."""

    tag: str
    feeds: dict[str, np.ndarray]
    shapes: dict[str, list[int]]


def task_in_worker(path: Path, pipeline: PipelineConfig, runtime: RuntimeConfig, *,
                   memory_limit_mb: float | None, timeout_s: float, nice: int) -> TaskTrial:
    """``run_task`` for the candidate at ``path``, in a subprocess under the trial's limits.

    Raises:
        OtaRejected: ``timeout`` (the child was killed after ``timeout_s``),
            ``out_of_memory`` (it failed to allocate within ``memory_limit_mb``),
            ``worker_crashed``, or what ``run_task`` and the load refuse.
    """
    request = TaskRequest(Path(path), pipeline, runtime, memory_limit_mb, nice)
    tag = str(type(pipeline.task).__struct_config__.tag)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with parent, child:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer.ota.task_child", str(child.fileno())],
            pass_fds=(child.fileno(),), env=_child_env(), stdin=subprocess.DEVNULL, stdout=2)
        conn = Connection(parent.detach())
    deadline = time.monotonic() + max(0.1, timeout_s)
    try:
        conn.send_bytes(pickle.dumps(request))
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise OtaRejected("timeout", f"building the {tag} task for the candidate took "
                                         f"longer than the {timeout_s:.3g} s the trial had left "
                                         "(ota.verify.timeout_s); its worker was killed")
        reply = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        proc.kill()
        raise _died(proc, tag, memory_limit_mb) from None
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        conn.close()
    if reply[0] == "ok":
        trial: TaskTrial = reply[1]
        return trial
    raise OtaRejected(reply[1], reply[2])


def _died(proc: subprocess.Popen[bytes], tag: str, memory_limit_mb: float | None
          ) -> OtaRejected:
    code = proc.wait()
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
    text = f"the worker building the {tag} task for the candidate died ({how})"
    if memory_limit_mb is not None and code < 0 and -code in _ALLOC_SIGNALS:
        return OtaRejected("out_of_memory", f"{text}, within its memory limit of "
                                            f"{memory_limit_mb:g} MiB (ota.verify.memory_limit_mb)")
    return OtaRejected("worker_crashed", text)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["MALLOC_ARENA_MAX"] = "2"  # each glibc arena reserves 64 MiB of the address-space limit
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = _PACKAGE_ROOT + (os.pathsep + path if path else "")
    return env


def run_task(model: Model, pipeline: PipelineConfig
             ) -> tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One synthetic frame through the pipeline's task, in the pipeline's call order.

    Returns:
        The task's tag, the feeds the model got (state included) and its outputs.

    Raises:
        OtaRejected: ``undecodable`` (the reason names the step).
    """
    from ..frames import DropFrame
    from ..tasks import make_task

    tag = str(type(pipeline.task).__struct_config__.tag)
    frame = synthetic_frame(pipeline)

    def undecodable(what: str, exc: BaseException) -> OtaRejected:
        detail = str(exc) or type(exc).__name__
        return OtaRejected("undecodable", f"the {tag} task {what}: {detail}")

    try:
        task: Task = make_task(pipeline.task, model)
    except MemoryError:
        raise
    except Exception as exc:  # the task's own check of the model's shapes (ConfigError...)
        raise undecodable("does not accept the model", exc) from exc
    try:
        feeds, context = task.preprocess(frame)
        feeds = task.inject_state(dict(feeds))
    except MemoryError:
        raise
    except DropFrame as exc:
        raise undecodable(f"dropped a synthetic {frame.kind} frame", exc) from exc
    except Exception as exc:
        raise undecodable(f"cannot prepare a {frame.kind} frame for the model", exc) from exc
    try:
        outputs = model.run(feeds)
    except InvalidInputError as exc:
        raise undecodable("feeds input the model does not take", exc) from exc
    except WorkerCrashedError:
        raise
    except InferenceError as exc:
        raise undecodable("input made the model fail", exc) from exc
    check_finite(outputs, f"the {tag} task's input")
    try:
        task.update_state(outputs)
        task.postprocess(outputs, frame, context)
    except MemoryError:
        raise
    except DropFrame:
        pass  # the task read the outputs and chose not to report this frame
    except Exception as exc:
        raise undecodable("cannot decode the outputs", exc) from exc
    return tag, feeds, outputs


def check_finite(outputs: Mapping[str, np.ndarray], what: str) -> None:
    """Refuse outputs with NaN or infinite values (``undecodable``)."""
    for name, value in outputs.items():
        a = np.asarray(value)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            bad = int(a.size - np.count_nonzero(np.isfinite(a)))
            raise OtaRejected("undecodable", f"output {name!r} holds {bad} NaN or infinite "
                                             f"values on {what}")


def synthetic_frame(pipeline: PipelineConfig) -> Frame:
    """A frame like the pipeline's source produces: the synthetic test pattern at the source's
    size (640 x 480 where it sets none) for image sources, a window of low noise for audio, a
    window of readings for sensors."""
    from ..config.pipeline import AudioSource, MqttSource, SerialSource
    from ..frames import Frame

    src = pipeline.source
    now, wall = time.monotonic(), time.time()
    rng = np.random.default_rng(0)
    if isinstance(src, AudioSource):
        # Low noise in [-1, 1], mono: what a quiet microphone gives.
        data = (rng.standard_normal(src.window) * 0.01).astype(np.float32)
        return Frame(0, now, wall, data, "audio", src.sample_rate, start=0.0)
    if isinstance(src, (SerialSource, MqttSource)):
        data = rng.standard_normal((src.window, max(1, len(src.fields)))).astype(np.float32)
        return Frame(0, now, wall, data, "series", fields=tuple(src.fields), start=0.0)
    from ..sources.synthetic import TestPattern

    width = getattr(src, "width", None) or _DEFAULT_SIZE[0]
    height = getattr(src, "height", None) or _DEFAULT_SIZE[1]
    return Frame(0, now, wall, TestPattern(width, height).draw(0))
