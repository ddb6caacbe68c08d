"""The pipeline engine: source -> preprocess -> model -> postprocess -> sinks, a thread per stage.

Three threads joined by two bounded queues:

- capture: reads the source, asks the detection gate (``detect:``, `gate`) whether the model
  runs on the frame, and preprocesses those it runs on (so capture and preprocessing overlap
  inference); the others pass through the later stages without the model, in order;
- infer: runs the model in frame order (a stateful task's state is handled here);
- emit: postprocesses, applies the emission policy, writes the sinks.

A live source never waits for inference: when the first queue is full its oldest frame is
dropped and counted, so results stay fresh. A file source blocks instead and nothing is skipped.
Per-stage latency and throughput are kept for stats with no logging on the per-frame path.
"""

# Over 450 lines: one Pipeline, whose three stage threads share its queues, counters, model-swap
# lock and health; what is not a stage already lives beside it (build, emission, tuning).

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Self

from ..config.pipeline import EmitConfig
from ..errors import (
    EdgeInferError,
    InferenceError,
    InvalidInputError,
    OutputLayoutError,
    StateError,
    WorkerCrashedError,
)
from ..frames import DropFrame, Frame, Latency, ModelRef, Result, TaskResult
from .emission import Emission
from .gate import DetectGate, GateDecision
from .gated import GatedFrames
from ..health import Health
from ..queues import Closed, DropOldestQueue
from ..model.pool import SharedModel
from ..sources.base import RateLimiter
from ..stats import PipelineStats
from .tuning import annotate, current_settings, tuned

if TYPE_CHECKING:
    from ..analytics.stage import SceneAnalytics
    from ..config import Config, PipelineConfig
    from ..model.model import Model
    from ..sinks import Sink
    from ..sources import Source
    from ..tasks import Task

logger = logging.getLogger("edgeinfer.pipeline")  # the name before the move

ResultCallback = Callable[[Result], None]
_MAX_HELD_EVENTS = 1000  # events waiting for a result to carry them (emit: min_interval_s)
# A model worker that crashed again within WORKER_SETTLED_S of its last crash is restarted after
# WORKER_BACKOFF_S, doubling up to WORKER_MAX_BACKOFF_S; the first crash restarts it at once.
WORKER_BACKOFF_S = 0.5
WORKER_MAX_BACKOFF_S = 10.0
WORKER_SETTLED_S = 30.0


class Pipeline:
    """One configured chain: ``start()``/``stop()``, ``run()`` until the source ends, or iterate
    (``for result in pipeline``). ``Pipeline.from_config`` builds one from the config file.

    Args:
        name: The pipeline's name (an MQTT topic level).
        source, model, task, sinks: The parts; the pipeline closes those it was given.
        emit: Which results to emit (every one, or on change; minimum interval).
        queue_size: Frames buffered between stages.
        on_result: Called with each emitted result (in the emit thread).
        seq_start: The last ``seq`` emitted before (a restarted daemon continues from the
            outbox's), so consumers see ``seq`` keep increasing.
        analytics: Tracking, zones, lines and event media of a detect pipeline; closed with
            the pipeline.
        gate: Which frames the model sees (``detect:``); ``None``: every frame. A frame it
            skips still reaches the tracker (predicted boxes), zones, lines, the recorder,
            ``latest()`` and the sinks, as a result with ``detected`` false.
    """

    def __init__(self, name: str, source: Source, model: Model, task: Task, sinks: list[Sink],
                 *, emit: EmitConfig | None = None, queue_size: int = 2,
                 on_result: ResultCallback | None = None, seq_start: int = 0,
                 analytics: SceneAnalytics | None = None, gate: DetectGate | None = None
                 ) -> None:
        self.name = name
        self.source = source
        self.model = model
        self.task = task
        self.sinks = sinks
        self.emit = emit or EmitConfig()
        self.on_result = on_result
        self.stats = PipelineStats()
        self.error: BaseException | None = None
        # What results name as their maker; one tuple, replaced whole at a swap.
        self._made_by = (ModelRef(model.name, model.version, model.sha256), model.provider)
        self._made_gen = model.generation  # the backend selector swaps sessions: see _infer
        self._prepared: DropOldestQueue = DropOldestQueue(queue_size, drop=source.live)
        self._inferred: DropOldestQueue = DropOldestQueue(queue_size, drop=False)
        self._threads: list[threading.Thread] = []
        # Stages still running; the last one to end finishes the pipeline. A count set before
        # any stage starts, not a look at the thread list: a stage that ends at once (a source of
        # one picture) must not see the others as "not alive" before they were even started.
        self._stages_left = 0
        self._stages_lock = threading.Lock()
        self._iter_queue: DropOldestQueue | None = None
        self._started = False
        self._closed = False
        self._done = threading.Event()
        self._swap_lock = threading.Lock()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._stopping = threading.Event()  # set by stop(): a backoff's wait ends
        self._worker_down: tuple[str, float | None] | None = None  # why, when it is retried
        self._worker_crashed_at = -WORKER_SETTLED_S
        self._worker_crashes = 0  # in a row: each within WORKER_SETTLED_S of the one before
        self._limiter: RateLimiter | None = None
        self._policy = Emission(self.emit)
        self._last: tuple[Frame, TaskResult] | None = None
        self._seq = seq_start
        # New at every start of the pipeline: with it (device, pipeline, run_id, seq) names one
        # result even where seq starts again (a device whose outbox was lost).
        self.run_id = secrets.token_hex(8)
        self.analytics = analytics
        self._events: list[dict[str, Any]] = []  # events not yet carried by a result
        self.gate = gate
        self._gated = GatedFrames(gate, analytics) if gate is not None else None
        # Since the last swap_model: inferences decoded and errors (the OTA health gate reads them).
        self.model_ok = 0
        self.model_errors = 0
        _bind(model, name)

    # -- building -------------------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: PipelineConfig | Config | str, *, name: str | None = None,
                    on_result: ResultCallback | None = None, **context: Any) -> Pipeline:
        """Build a pipeline from a ``PipelineConfig``, a whole ``Config`` (its only pipeline, or
        the one called ``name``) or a config file path. ``context`` reaches sources and sinks
        (e.g. ``subscribe`` for an MQTT source)."""
        from .build import build_pipeline

        return build_pipeline(config, name=name, on_result=on_result, **context)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the sinks and the source and start the stage threads."""
        if self._started:
            raise StateError(f"pipeline {self.name!r} was already started")
        self._started = True
        for sink in self.sinks:
            sink.open()
        if self.analytics is not None:
            self.analytics.start(self.run_id)
        self.source.__enter__()
        self.stats.start()
        stages = ((self._capture, "capture"), (self._infer, "infer"), (self._emit, "emit"))
        self._stages_left = len(stages)
        for target, stage in stages:
            t = threading.Thread(target=self._guard, args=(target,), daemon=True,
                                 name=f"edgeinfer-{self.name}-{stage}")
            self._threads.append(t)
        for started, t in enumerate(self._threads):
            try:
                t.start()
            except RuntimeError as exc:  # "can't start new thread": out of threads or memory
                self._abandon(len(self._threads) - started, exc)
                raise EdgeInferError(f"pipeline {self.name!r}: cannot start its stage threads: "
                                    f"{exc}") from exc

    def stop(self) -> None:
        """Ask the source to stop; frames already read are still processed. Idempotent."""
        self._stopping.set()
        self.source.stop()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every stage has finished; ``True`` if they did."""
        return self._done.wait(timeout)

    def run(self) -> None:
        """Start (if needed), block until the source ends or ``stop()``, then close.

        Raises:
            EdgeInferError: the error that ended the pipeline (a source that gave up, say).
        """
        if not self._started:
            self.start()
        try:
            while not self._done.wait(0.5):
                pass
        finally:
            self.close()
        if self.error is not None:
            raise self.error

    def close(self, timeout: float = 10.0) -> None:
        """Stop, wait for the stages (up to ``timeout``), close source, sinks and model."""
        if self._closed:
            return
        self._closed = True
        self.stop()
        if self._started and not self._done.wait(timeout):
            logger.warning("pipeline %s: stages did not finish within %.0f s", self.name, timeout)
            self._prepared.close()
            self._inferred.close()
        if self._started:
            self.source.__exit__(None, None, None)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # one broken sink must not keep the others open
                logger.warning("pipeline %s: closing sink failed: %s", self.name, exc)
        if self.analytics is not None:
            try:
                self.analytics.close()
            except Exception as exc:  # counters or clips lost must not keep the model open
                logger.warning("pipeline %s: closing analytics failed: %s", self.name, exc)
        self.model.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Result]:
        """Run the pipeline and yield each emitted result; ends with the source."""
        if self._started:
            raise StateError("iterate a pipeline instead of starting it, not both")
        self._iter_queue = DropOldestQueue(64, drop=False)
        self.start()
        try:
            while True:
                try:
                    yield self._iter_queue.get()
                except Closed:
                    break
        finally:
            self.close()
        if self.error is not None:
            raise self.error

    # -- model swap (OTA) -----------------------------------------------------------------------
    def swap_model(self, model: Model, task: Task) -> Model:
        """Switch to ``model`` (already loaded and warmed) and its ``task`` between two frames;
        returns the old model, which the caller closes.

        A frame preprocessed for the old task is preprocessed again for the new one; a frame
        already inferred is emitted with the old model's name, so every result names the model
        that produced it. ``model_ok``/``model_errors`` count from zero again.
        """
        _bind(model, self.name)
        with self._swap_lock:
            old = self.model
            self.model, self.task = model, task
            self._made_by = (ModelRef(model.name, model.version, model.sha256), model.provider)
            self._made_gen = model.generation
            self.model_ok = self.model_errors = 0
        return old

    # -- control (commands) ---------------------------------------------------------------------
    def pause(self) -> None:
        """Stop processing: a live source keeps being read and its frames are skipped (so no
        stale buffer on resume); a file source waits."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def tune(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Change runtime-tunable settings; returns the settings now in force.

        Tunable: the task's numeric settings (``score_threshold``, ``iou_threshold``,
        ``max_detections``, ``top_k``, ``threshold``, ``min_speech_ms``, ``min_silence_ms``),
        ``max_fps`` (a cap on frames taken from the source; ``null`` lifts it), ``emit_mode``
        and ``min_interval_s``. Values are validated like the config file's.

        Raises:
            ConfigError: an unknown or untunable field, or a value out of range.
        """
        tuning = tuned(self.name, self.task.config, self.emit, self._limiter, changes)
        # All validated: apply together (each is one reference swap the stages pick up).
        if tuning.task_config is not None:
            self.task.config = tuning.task_config
        if tuning.emit is not None:
            self.emit = tuning.emit
            self._policy = Emission(tuning.emit)
        self._limiter = tuning.limiter
        return current_settings(self.task.config, self.emit, self._limiter)

    def latest(self) -> tuple[Frame, TaskResult] | None:
        """The latest processed frame and what the task made of it (``None``: none yet)."""
        return self._last

    def snapshot_jpeg(self, quality: int = 85) -> bytes:
        """The latest processed image frame as JPEG, with its detections drawn.

        Raises:
            StateError: no image frame processed yet.
        """
        last = self._last
        if last is None or last[0].kind != "image":
            raise StateError(f"pipeline {self.name!r} has processed no image frame yet")
        geometry = self.analytics.geometry() if self.analytics is not None else ()
        return annotate(last[0], last[1], quality, geometry)

    # -- stages ---------------------------------------------------------------------------------
    def _guard(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # a stage that dies ends the pipeline, with the reason
            if self.error is None:
                self.error = exc
            logger.error("pipeline %s stopped: %s", self.name, exc,
                         exc_info=not isinstance(exc, EdgeInferError))
            self.source.stop()
            if target != self._capture:
                # Downstream of a failed capture, the frames already read are still processed
                # (capture's own exit closed its queue); a failed later stage stops everything.
                self._prepared.close()
                self._inferred.close()
                if self._iter_queue is not None:
                    self._iter_queue.close()
        finally:
            self._stage_ended()

    def _stage_ended(self, count: int = 1) -> None:
        with self._stages_lock:
            self._stages_left -= count
            last = self._stages_left == 0
        if last:
            self._finish()

    def _abandon(self, never_started: int, exc: BaseException) -> None:
        """Stages that could not start: end the started ones and count the rest as ended."""
        if self.error is None:
            self.error = exc
        self.source.stop()
        self._prepared.close()
        self._inferred.close()
        self._stage_ended(never_started)

    def _finish(self) -> None:
        if self._iter_queue is not None:
            self._iter_queue.close()
        self.stats.stop()
        self._done.set()

    def _capture(self) -> None:
        stats = self.stats
        clock = time.perf_counter
        live = self.source.live
        gate = self.gate
        try:
            for frame in self.source:
                if not self._running.is_set():
                    if live:  # a paused camera keeps being read (no stale buffer on resume)
                        stats.paused += 1
                        continue
                    while not self._running.wait(0.2) and not self.source.stopped:
                        pass
                limiter = self._limiter
                if limiter is not None and not limiter.admit(frame.ts):
                    stats.paused += 1
                    continue
                t0 = clock()
                task = self.task
                decision = gate.decide(frame) if gate is not None else None
                if decision is not None and not decision.detect:
                    item: tuple[Any, ...] = (frame, None, None, task, decision)
                    stats.skipped_by_gate += 1
                else:
                    try:
                        feeds, context = _prepare(task, frame, decision)
                    except DropFrame:
                        stats.dropped_by_task += 1
                        continue
                    stats.pre.add((clock() - t0) * 1000)
                    item = (frame, feeds, context, task, decision)
                stats.frames_in += 1
                try:
                    if self._prepared.put(item):
                        stats.dropped_queue += 1
                except Closed:  # a later stage ended the pipeline
                    return
        finally:
            self._prepared.close()

    def _infer(self) -> None:
        stats = self.stats
        clock = time.perf_counter
        try:
            while True:
                try:
                    frame, feeds, context, prepared_by, decision = self._prepared.get()
                except Closed:
                    return
                if feeds is None:  # the gate kept it from the model: on to emit, in order
                    try:
                        self._inferred.put((frame, None, None, prepared_by, self._made_by,
                                            decision))
                    except Closed:
                        return
                    continue
                with self._swap_lock:
                    model, task, ref = self.model, self.task, self._made_by
                    if model.generation != self._made_gen:  # measured backend swapped in
                        self._made_gen = model.generation
                        ref = self._made_by = (ref[0], model.provider)
                if prepared_by is not task:  # a swap came between: prepare it for the new model
                    try:
                        feeds, context = _prepare(task, frame, decision)
                    except DropFrame:
                        stats.dropped_by_task += 1
                        continue
                t0 = clock()
                try:
                    outputs = model.run(task.inject_state(feeds))
                except WorkerCrashedError as exc:
                    stats.errors += 1
                    self.model_errors += 1
                    self._restart_worker(model, exc)
                    continue
                except (InferenceError, InvalidInputError) as exc:
                    # One bad frame (a camera that changed resolution, data the runtime
                    # refuses) is skipped and counted; the stream goes on.
                    stats.errors += 1
                    self.model_errors += 1
                    stats.last_error = str(exc)
                    continue
                task.update_state(outputs)
                took = (clock() - t0) * 1000
                if isinstance(model, SharedModel):  # the model's own time, and the wait for it
                    stats.wait.add(model.last_wait_ms)
                    took = max(took - model.last_wait_ms, 0.0)
                stats.infer.add(took)
                try:
                    self._inferred.put((frame, outputs, context, task, ref, decision))
                except Closed:
                    return
        finally:
            self._inferred.close()

    def _restart_worker(self, model: Model, exc: WorkerCrashedError) -> None:
        """Start a fresh model worker after ``exc``: at once after the first crash, after a
        doubling wait when it crashes again soon after, and again with that wait while it does
        not start; the pipeline is ``reconnecting`` with the reason meanwhile. Frames of a live
        source go on being read, and dropped (counted) while the model is down."""
        self.stats.last_error = str(exc)
        self.stats.worker_restarts += 1
        now = time.monotonic()
        if now - self._worker_crashed_at > WORKER_SETTLED_S:
            self._worker_crashes = 0
        self._worker_crashed_at = now
        what = str(exc).removesuffix("; call restart()")  # what this method does next
        reason = f"its model worker crashed ({what})"
        try:
            while True:
                n = self._worker_crashes
                self._worker_crashes += 1
                delay = 0.0 if n == 0 else min(WORKER_MAX_BACKOFF_S,
                                                WORKER_BACKOFF_S * 2 ** (n - 1))
                logger.warning("pipeline %s: %s; restarting it%s", self.name, reason,
                               f" in {delay:.1f} s" if delay else "")
                self._worker_down = (f"{reason}; restarting it", time.time() + delay
                                     if delay else None)
                if delay and self._stopping.wait(delay):
                    return  # stopped meanwhile: nothing to restart for
                try:
                    model.restart()
                    return
                except (EdgeInferError, OSError) as failed:  # it does not start again
                    reason = f"its model worker crashed ({what}) and did not start again: {failed}"
                    self.stats.last_error = reason
        finally:
            self._worker_down = None

    def _emit(self) -> None:
        stats = self.stats
        clock = time.perf_counter
        analytics = self.analytics
        while True:
            try:
                frame, outputs, context, task, ref, decision = self._inferred.get()
            except Closed:
                break
            t0 = clock()
            gated = self._gated
            if outputs is None:  # kept from the model by the gate: tracked positions
                assert gated is not None and decision is not None
                held, found = gated.skipped(frame, decision)
                if held is None:  # no detection yet to go on from
                    continue
                self._emit_frame(frame, held, found, t0, False, ref)
                continue
            try:
                part = task.postprocess(outputs, frame, context)
            except DropFrame:
                stats.dropped_by_task += 1
                continue
            except OutputLayoutError:  # every result would be wrong: stop (see _guard)
                raise
            except Exception as exc:  # a decoding failure costs one frame, not the pipeline
                stats.errors += 1
                if task is self.task:
                    self.model_errors += 1
                stats.last_error = f"postprocess: {type(exc).__name__}: {exc}"
                if stats.errors == 1 or logger.isEnabledFor(logging.DEBUG):
                    logger.error("pipeline %s: postprocessing frame %d failed", self.name,
                                 frame.index, exc_info=True)
                continue
            events: list[dict[str, Any]] = []
            if gated is not None and decision is not None:
                part, events = gated.detected(frame, part, decision)
            elif analytics is not None:
                part, events = analytics.process(frame, part)  # every frame: tracks need them
            stats.detected += 1
            if task is self.task:
                self.model_ok += 1
            self._emit_frame(frame, part, events, t0, True, ref)
        pending = self._policy.flush()
        if pending is not None:
            self._deliver(*pending, ref)

    def _emit_frame(self, frame: Frame, part: TaskResult, events: list[dict[str, Any]],
                    t0: float, detected: bool, ref: tuple[ModelRef, str]) -> None:
        """Count a processed frame, publish its events, offer it to the emission policy."""
        stats = self.stats
        if events:
            self._publish_events(events)
        post_ms = (time.perf_counter() - t0) * 1000
        stats.post.add(post_ms)
        stats.processed += 1
        stats.recent.add(time.monotonic())
        self._last = (frame, part)
        ready = self._policy.offer(frame, part, post_ms, detected)
        if ready is not None:
            self._deliver(*ready, ref)

    def _deliver(self, frame: Frame, part: TaskResult, post_ms: float, detected: bool,
                 ref: tuple[ModelRef, str]) -> None:
        stats = self.stats
        stats.emitted += 1
        self._seq += 1
        events: tuple[dict[str, Any], ...] = ()
        if self._events:  # every event rides on exactly one result, the next one emitted
            events, self._events = tuple(self._events), []
        result = Result(
            seq=self._seq, ts=time.time(), pipeline=self.name, frame=frame, model=ref[0],
            provider=ref[1],
            latency_ms=Latency(stats.pre.last, stats.infer.last, post_ms) if detected
            else Latency(0.0, 0.0, post_ms), task=part, events=events, run_id=self.run_id,
            detected=detected,
        )
        stats.latency.add((time.monotonic() - frame.ts) * 1000)
        for sink in self.sinks:
            try:
                sink.write(result)
            except Exception as exc:  # a full disk on one sink must not stop the others
                stats.sink_errors += 1
                stats.last_error = f"sink {type(sink).__name__}: {exc}"
                sink.failed(exc, self.name)  # counted, logged (rate-limited), failing
            else:
                if sink.failing_since:
                    sink.succeeded(self.name)
        if self.on_result is not None:
            self.on_result(result)
        if self._iter_queue is not None:
            try:
                self._iter_queue.put(result)
            except Closed:  # the consumer stopped iterating
                self.source.stop()

    def _publish_events(self, events: list[dict[str, Any]]) -> None:
        """Hand a frame's events to the sinks that publish them (the MQTT sink's outbox) and
        keep them for the next result."""
        stats = self.stats
        for event in events:  # made with it (SceneAnalytics.start); a value, never a new key,
            if event.get("run_id") != self.run_id:  # since the web view may be reading it
                event["run_id"] = self.run_id
        self._events.extend(events)
        if len(self._events) > _MAX_HELD_EVENTS:  # emission held back for long: keep the newest
            del self._events[:-_MAX_HELD_EVENTS]
        stats.events += len(events)
        for sink in self.sinks:
            try:
                for event in events:
                    sink.write_event(self.name, event)
            except Exception as exc:
                stats.sink_errors += 1
                stats.last_error = f"sink {type(sink).__name__}: {exc}"
                sink.failed(exc, self.name)

    @property
    def model_waiting(self) -> bool:
        """Whether its model worker crashed and is being restarted (``health()`` says why)."""
        return self._worker_down is not None

    def health(self) -> Health:
        """The pipeline's state (``edgeinfer.health``), what every surface shows: ``failed``
        with the error; ``reconnecting`` while its model worker is restarted after a crash;
        ``no_source`` / ``reconnecting`` while its live source is out (also after the pipeline
        ended, so the exit summary names why it never ran); ``done``;
        ``paused``; ``starting`` before ``start()``; else ``running``."""
        if self.error is not None:
            return Health("failed", f"{self.error}", self.source.stats.retries)
        worker = self._worker_down
        if worker is not None and not self._done.is_set():
            return Health("reconnecting", worker[0], self.source.stats.retries, worker[1])
        source = self.source.health()
        if source is not None and not source.ok:
            return source
        if self._done.is_set():
            return Health("done", "", self.source.stats.retries)
        if not self._started:
            return Health("starting")
        if self.paused:
            return Health("paused", "paused by a command: resume it to go on",
                          self.source.stats.retries)
        # A source that works may still say why some of its frames were left out.
        return Health("running", source.reason if source is not None else "",
                      self.source.stats.retries)

    def snapshot(self) -> dict[str, Any]:
        """Stats of this pipeline for the stats topic and summaries."""
        health = self.health()
        data = self.stats.snapshot(running=health.ok)
        ref, provider = self._made_by
        model = self.model
        data.update(
            pipeline=self.name,
            model={"name": ref.name, "version": ref.version, "sha256": ref.sha256},
            provider=provider,
            backend=_backend(model),
            task=self.task.describe() or None,  # a detector's decoder and labels, and why
            # the pipelines running one loaded model with this one (None: a model of its own)
            shared=model.shared_stats() if isinstance(model, SharedModel) else None,
            source=self.source.stats.to_dict(),
            queues={"prepared": len(self._prepared), "inferred": len(self._inferred)},
            # failing sinks make the pipeline unhealthy (the daemon acts on it if it lasts)
            healthy=not any(s.failing_since for s in self.sinks),
            sinks_failing={type(s).__name__: s.last_error for s in self.sinks if s.failing_since},
            state=health.state,
            health=health.to_dict(),
        )
        if self.analytics is not None:
            data["analytics"] = self.analytics.stats()
        gate = self.gate
        if gate is not None:  # read here: the capture thread counts without a lock
            data["detect"].update(gate=gate.mode, cropped=gate.cropped,
                                  motion_ratio=round(gate.moving / gate.judged, 4)
                                  if gate.judged else None)
        return data


def _prepare(task: Task, frame: Frame, decision: GateDecision | None) -> tuple[Any, Any]:
    """The task's feeds and context for ``frame``, or for the gate's crop of it."""
    if decision is not None and decision.region is not None:
        return task.preprocess_region(frame, decision.region)
    return task.preprocess(frame)


def _backend(model: Model) -> dict[str, Any] | None:
    """The exact backend choice and whether measuring is under way (None: model closed)."""
    if model.closed:
        return None
    report = model.report
    choice = report.choice
    selection = report.selection or {}
    return {"choice": choice.label() if choice is not None else model.provider,
            "selecting": model.selecting,
            # provisional until re-checked on an idle box (runtime/recheck.py)
            "measured_under_load": bool(selection.get("measured_under_load")),
            "rechecks": int(selection.get("rechecks") or 0)}


def _bind(model: Model, pipeline: str) -> None:
    """Name the pipeline on a shared model's handle (its stats list who shares the model)."""
    if isinstance(model, SharedModel):
        model.owner = pipeline
