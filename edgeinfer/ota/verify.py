"""Verification of a pushed model before it is used (``docs/ota.md``, "Verification").

``check_file`` (``filecheck``, re-exported here) looks at the staged file's bytes only: size,
sha256, the format read from the bytes, no external data, the size limit. ``trial_run`` loads
the candidate in an isolated worker process under a memory limit, with the pipeline's model
options, runs the golden inputs (or a synthetic frame through the pipeline's own task, exactly
as the pipeline does: ``preprocess``, ``inject_state``, the model, ``update_state``,
``postprocess``), checks that the task decodes finite outputs, and times it against the running
model: the current model's file loaded in a second worker with the same options, niceness and
isolation, the two run in turns on the same synthetic frame at the moment of the decision
(``timing.compare_latency``). A comparison too noisy to conclude never refuses the candidate.
Every refusal is an ``OtaRejected`` whose ``reason`` is one of the status reason codes.

A watchdog thread bounds the whole trial (load and runs) by ``timeout_s``: when it fires it
kills the worker process, which makes the blocked call return, and the trial is refused with
``timeout``. The daemon's own model is never touched.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..errors import (
    EdgeInferError,
    InferenceError,
    InvalidInputError,
    OtaRejected,
    WorkerCrashedError,
)
from .filecheck import check_file
from .taskrun import check_finite, run_task, synthetic_frame, task_in_worker
from .timing import SpeedVerdict, compare_latency
from .watchdog import TrialWatchdog, rejection_for

if TYPE_CHECKING:
    from ..config import PipelineConfig, RuntimeConfig
    from ..model.model import Model

__all__ = ["GOLDEN_OUTPUT_PREFIX", "VerifyReport", "check_file", "synthetic_frame", "trial_run"]

logger = logging.getLogger(__name__)

# Below a millisecond, per-call overhead and scheduling noise dwarf the model: a slowdown
# counts only when it is also more than this in absolute terms.
SLOWDOWN_FLOOR_MS = 1.0
VERIFY_NICE = 10  # the trial run yields the CPU to the running pipelines

GOLDEN_OUTPUT_PREFIX = "out:"
"""Keys of a golden ``.npz`` that hold expected outputs (``out:<output name>``); the others are
inputs by name."""


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What a successful ``trial_run`` measured.

    Attributes:
        latency_ms: Median of the candidate's timed runs in the worker (inter-process copy
            included).
        baseline_ms: The current model's median, timed in turns with the candidate in the same
            trial (``None``: not compared).
        outputs: Output name -> shape seen on the trial input.
        checks: What passed, in order, readable (``"golden (1 inputs, 1 outputs)"``, ...).
        provider: The provider the candidate ran on.
        speed: The comparison with the current model (``None``: not compared); its
            ``verdict`` is ``"ok"`` or ``"inconclusive"`` (too noisy to conclude: passed).
        speed_note: What the speed check concluded, in words (also the last of ``checks``).
    """

    latency_ms: float
    baseline_ms: float | None
    outputs: dict[str, list[int]]
    checks: list[str]
    provider: str
    speed: SpeedVerdict | None = None
    speed_note: str = ""


# --- the trial run -----------------------------------------------------------------------------


def trial_run(path: Path, pipeline: PipelineConfig, runtime: RuntimeConfig, *,
              golden: Mapping[str, np.ndarray] | None = None, atol: float = 1e-3,
              rtol: float = 1e-3, current: Path | None = None, max_slowdown: float = 2.0,
              memory_limit_mb: float | None = 512, timeout_s: float = 120.0,
              runs: int = 5, compare_s: float = 10.0) -> VerifyReport:
    """Load ``path`` in an isolated worker as ``pipeline`` would, run it, decode it, and time
    it in turns with the ``current`` model.

    Args:
        path: The candidate model (already through ``check_file``).
        pipeline: The pipeline whose model it replaces: model options, task and source.
        runtime: The daemon's runtime settings (state directory, model size limit).
        golden: Inputs by input name and expected outputs as ``out:<output name>``.
        atol, rtol: Tolerances of the golden comparison (``np.allclose``).
        current: The model the pipeline runs now: loaded in a second worker with the same
            options and niceness, timed in turns with the candidate; ``None``: the candidate's
            latency is measured, not compared. A current model that cannot be timed there
            leaves the speed unchecked (logged), never refuses the candidate.
        max_slowdown: Refuse a candidate surely slower than ``max_slowdown`` times the current
            model (the whole 95 % interval of the paired ratio above it, and more than
            ``SLOWDOWN_FLOOR_MS`` slower).
        memory_limit_mb: The candidate worker's memory limit (``ota.verify.memory_limit_mb``).
        timeout_s: Loading and all runs together; past it the workers are killed.
        runs: The fewest rounds of the comparison (the fewest timed runs without ``current``).
        compare_s: The most time the comparison takes (less when the timeout leaves less);
            a comparison still unsettled then passes as too noisy to conclude.

    Returns:
        The measurements and the checks that passed.

    Raises:
        OtaRejected: ``load_failed``, ``out_of_memory``, ``worker_crashed``, ``timeout``,
            ``golden_mismatch``, ``undecodable``, ``too_slow`` (also ``oversize`` and
            ``unsafe_model`` if the file changed since ``check_file``).
    """
    watchdog = TrialWatchdog(timeout_s)
    loading: _Loading | None = None
    try:
        with watchdog:
            # The current model loads in its own worker while the candidate loads: two niced
            # workers starting on a busy box take half the time side by side.
            if current is not None:
                loading = _Loading(Path(current), pipeline, runtime, watchdog)
            try:
                model = _load(Path(path), pipeline, runtime, memory_limit_mb,
                              watchdog.remaining())
                watchdog.models.append(model)
                watchdog.check()
                checks, shapes, feeds = _exercise(Path(path), model, pipeline, runtime,
                                                  watchdog,
                                                  golden=golden, atol=atol, rtol=rtol,
                                                  memory_limit_mb=memory_limit_mb)
                if current is None:
                    latency = _time_runs(model, feeds, runs, watchdog)
                    checks.append(f"latency {latency:.2f} ms (not compared)")
                    return _report(model, latency, None, shapes, checks)
                assert loading is not None
                other = loading.result()
                if other is None:
                    latency = _time_runs(model, feeds, runs, watchdog)
                    checks.append(f"latency {latency:.2f} ms (not compared: the current model "
                                  "could not be timed in a trial worker)")
                    return _report(model, latency, None, shapes, checks)
                other_model, other_feeds = other
                provider = model.provider
                speed = compare_latency(
                    lambda: other_model.run(other_feeds), lambda: model.run(feeds),
                    max_slowdown=max_slowdown, floor_ms=SLOWDOWN_FLOOR_MS, min_rounds=runs,
                    budget_s=min(compare_s, 0.5 * watchdog.remaining()), check=watchdog.check)
            except OtaRejected as exc:
                # a refusal that is itself the timeout (the task's worker, which says which
                # step) stays; anything else after the watchdog fired is the kill's doing
                if watchdog.fired and exc.reason != "timeout":
                    raise watchdog.rejection() from None
                raise
            except EdgeInferError as exc:
                raise rejection_for(exc, watchdog, memory_limit_mb) from exc
    finally:
        if loading is not None:
            loading.close()
        for m in watchdog.models:
            m.close()
    note = speed.describe()
    if speed.verdict == "too_slow":
        raise OtaRejected("too_slow", f"the new model is slower than allowed: {note}")
    checks.append(note)
    if speed.verdict == "inconclusive":
        logger.warning("candidate %s: %s", path, note)
    logger.info("candidate %s passed its trial run: %s", path, "; ".join(checks))
    return VerifyReport(latency_ms=speed.candidate_ms, baseline_ms=speed.current_ms,
                        outputs=shapes, checks=checks, provider=provider, speed=speed,
                        speed_note=note)


def _report(model: Model, latency: float, baseline: float | None, shapes: dict[str, list[int]],
            checks: list[str]) -> VerifyReport:
    logger.info("candidate %s passed its trial run: %s", model.path, "; ".join(checks))
    return VerifyReport(latency_ms=latency, baseline_ms=baseline, outputs=shapes, checks=checks,
                        provider=model.provider, speed_note=checks[-1])


class _Loading:
    """The current model loading in a trial worker like the candidate's, in a thread: same
    options, niceness and isolation; no memory limit (it runs already, and the limit does not
    change its speed). ``result()`` gives it with its own task's feeds from the same synthetic
    frame, or ``None`` (logged) when it cannot be timed there: the candidate is not refused for
    that."""

    def __init__(self, path: Path, pipeline: PipelineConfig, runtime: RuntimeConfig,
                 watchdog: TrialWatchdog) -> None:
        self.path, self.pipeline, self.watchdog = path, pipeline, watchdog
        self.model: Model | None = None
        self.error: EdgeInferError | None = None
        self._thread = threading.Thread(target=self._load, args=(runtime,), daemon=True,
                                        name="ota-verify-current")
        self._thread.start()

    def _load(self, runtime: RuntimeConfig) -> None:
        try:
            self.model = _load(self.path, self.pipeline, runtime, None,
                               self.watchdog.remaining())
        except EdgeInferError as exc:
            self.error = exc

    def result(self) -> tuple[Model, dict[str, np.ndarray]] | None:
        self._thread.join()  # bounded: the load has the trial's remaining time as its timeout
        if self.model is None:
            self._untimed("does not load", self.error)
            return None
        self.watchdog.models.append(self.model)
        try:
            _, feeds, _ = run_task(self.model, self.pipeline)
        except EdgeInferError as exc:
            self._untimed("does not run", exc)
            return None
        return self.model, feeds

    def _untimed(self, what: str, exc: EdgeInferError | None) -> None:
        if self.watchdog.fired:
            raise self.watchdog.rejection()
        logger.warning("ota: the current model %s %s in a trial worker (%s); the candidate's "
                       "speed is not compared", self.path, what, exc)

    def close(self) -> None:
        """Wait for the load (a candidate refused early) and close what it opened."""
        self._thread.join()
        if self.model is not None and self.model not in self.watchdog.models:
            self.model.close()


def _load(path: Path, pipeline: PipelineConfig, runtime: RuntimeConfig,
          memory_limit_mb: float | None, timeout_s: float) -> Model:
    """The candidate with the pipeline's options, in a worker, without the optimized-model
    cache (a rejected candidate must leave nothing behind)."""
    from ..pipeline.build import task_load_options
    from ..model.load import load_model

    kwargs = pipeline.model.load_kwargs(default_max_model_mb=runtime.max_model_mb)
    for key, value in task_load_options(pipeline, path).items():
        if not kwargs.get(key):  # what the config says explicitly wins, as in assembly
            kwargs[key] = value
            if key == "input_shapes":
                _check_task_inputs(path, pipeline, value)
    # probe=False: the candidate is checked on the model's own runtime; measuring backends
    # (seconds, a decision written to the state dir) is for the model that gets committed,
    # when its pipeline starts on it, and a rejected candidate must leave nothing behind.
    kwargs.update(isolation="process", memory_limit_mb=memory_limit_mb, probe=False,
                  worker_timeout_s=max(0.1, timeout_s), worker_nice=VERIFY_NICE)
    return load_model(path, **kwargs, state_dir=runtime.resolved_state_dir(),
                      cache_dir=runtime.resolved_cache_dir(), optimized_model_cache=False)


def _check_task_inputs(path: Path, pipeline: PipelineConfig,
                       shapes: Mapping[str, object]) -> None:
    """A task that implies input shapes (``vad``: Silero's ``input`` and ``state``) refuses a
    model without those inputs before the load would fail on them."""
    from ..runtime.modelfile import inspect_model

    try:
        info = inspect_model(path, digest=False)
    except EdgeInferError:
        return  # the load reports it with its own message
    if info.onnx is None:
        return
    missing = sorted(set(shapes) - set(info.onnx.inputs))
    if missing:
        tag = type(pipeline.task).__struct_config__.tag
        raise OtaRejected("undecodable", f"the {tag} task feeds inputs {missing} that the "
                                         f"model does not have (its inputs: "
                                         f"{sorted(info.onnx.inputs)})")


def _exercise(path: Path, model: Model, pipeline: PipelineConfig, runtime: RuntimeConfig,
              watchdog: TrialWatchdog, *, golden: Mapping[str, np.ndarray] | None, atol: float,
              rtol: float, memory_limit_mb: float | None
              ) -> tuple[list[str], dict[str, list[int]], dict[str, np.ndarray]]:
    """The golden and task checks; the checks passed, the output shapes and the task's feeds
    (what the speed check times: the input the pipeline gives the model). The task is built
    and run in a child under the trial's memory limit and remaining time (``taskrun``):
    nothing the candidate's contents drive runs in this process."""
    checks = [f"loads in an isolated worker ({model.provider})"]
    shapes: dict[str, list[int]] = {}
    if golden is not None:
        outputs = _run_golden(model, golden, atol, rtol)
        shapes.update({k: list(v.shape) for k, v in outputs.items()})
        compared = sum(1 for k in golden if k.startswith(GOLDEN_OUTPUT_PREFIX))
        checks.append(f"golden ({len(_golden_inputs(golden))} inputs, {compared} outputs "
                      "compared)")
        watchdog.check()
    task = task_in_worker(path, pipeline, runtime, memory_limit_mb=memory_limit_mb,
                          timeout_s=watchdog.remaining(), nice=VERIFY_NICE)
    watchdog.check()
    if golden is None:
        shapes.update(task.shapes)
    checks.append(f"task {task.tag} decodes")
    checks.append("outputs finite")
    watchdog.check()
    return checks, shapes, task.feeds


def _golden_inputs(golden: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in golden.items()
            if not k.startswith(GOLDEN_OUTPUT_PREFIX)}


def _run_golden(model: Model, golden: Mapping[str, np.ndarray], atol: float,
                rtol: float) -> dict[str, np.ndarray]:
    """Run the golden inputs; compare every ``out:`` array with the output of that name."""
    feeds = _golden_inputs(golden)
    try:
        outputs = model.run(feeds)
    except InvalidInputError as exc:
        raise OtaRejected("golden_mismatch", f"the model does not take the golden inputs "
                                             f"{sorted(feeds)}: {exc}") from exc
    except WorkerCrashedError:
        raise
    except InferenceError as exc:
        raise OtaRejected("golden_mismatch", f"the model failed on the golden inputs: "
                                             f"{exc}") from exc
    check_finite(outputs, "the golden inputs")
    for key, value in golden.items():
        if not key.startswith(GOLDEN_OUTPUT_PREFIX):
            continue
        name = key[len(GOLDEN_OUTPUT_PREFIX):]
        if name not in outputs:
            raise OtaRejected("golden_mismatch", f"the golden file expects output {name!r}; "
                                                 f"the model has {sorted(outputs)}")
        got, want = np.asarray(outputs[name]), np.asarray(value)
        if got.shape != want.shape:
            raise OtaRejected("golden_mismatch", f"output {name!r} has shape {list(got.shape)},"
                                                 f" the golden file {list(want.shape)}")
        g64, w64 = got.astype(np.float64), want.astype(np.float64)
        if not np.allclose(g64, w64, atol=atol, rtol=rtol):
            err = float(np.max(np.abs(g64 - w64))) if got.size else 0.0
            raise OtaRejected("golden_mismatch", f"output {name!r} differs from the golden "
                                                 f"output by up to {err:.6g} (atol {atol:g}, "
                                                 f"rtol {rtol:g})")
    return outputs


def _time_runs(model: Model, feeds: dict[str, np.ndarray], runs: int,
               watchdog: TrialWatchdog) -> float:
    """Median wall time of ``runs`` calls (at least one), in milliseconds."""
    clock = time.perf_counter
    times = []
    for _ in range(max(1, runs)):
        t0 = clock()
        model.run(feeds)
        times.append((clock() - t0) * 1000)
        watchdog.check()
    return float(statistics.median(times))
