"""``Model``: the public face of a loaded model, whatever runs it (``load_model`` in
``model.load`` makes one)."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EdgeInferError, ModelMemoryError, StateError
from ..runtime import select
from ..runtime.base import (
    LoadReport,
    Session,
    SessionSpec,
    TensorSpec,
    check_feeds,
)
from ..runtime.charged import ChargedOpener, ChargedSession
from ..runtime.guarded import measure_guarded
from ..runtime.memory import process_budget
from ..runtime.modelfile import ModelFileInfo
from ..runtime.recheck import RecheckPolicy, Watch

if TYPE_CHECKING:
    from ..runtime.select import Decision, Gate

logger = logging.getLogger("edgeinfer.model")  # the name before the move

_measuring: weakref.WeakSet[Model] = weakref.WeakSet()  # models measuring in the background


def _stop_measuring() -> None:
    """At exit, stop background measurements first: a native thread pool torn down while a
    session compiles aborts the process ("terminate called without an active exception")."""
    for model in list(_measuring):
        model.stop_selecting(timeout=30.0)


# threading's exit hooks run before atexit's (which tear backends down, e.g. LiteRT's
# environment): measuring threads are stopped while every backend still stands.
getattr(threading, "_register_atexit", atexit.register)(_stop_measuring)


class Model:
    """A loaded model on a verified provider. Use as a context manager or call ``close()``.

    Attributes:
        name, version: from the caller (default: the file's stem, ``None``).
        path, format, sha256, size_bytes, metadata: the model file.
        inputs, outputs: ``TensorSpec`` per tensor (name, shape, dtype).
        report: how the session was built (provider fallbacks, cache, probe, memory, warm-up).
    """

    def __init__(self, session: Session, info: ModelFileInfo, spec: SessionSpec,
                 name: str, version: str | None, budget_key: int,
                 gate: Gate | None = None) -> None:
        self._session: Session | None = session
        # Runs in flight per session, so a session swapped out by the backend selector is
        # closed only when the last run on it has returned.
        self._swap_lock = threading.Lock()
        self._inflight: dict[int, int] = {}
        self._retired: list[Session] = []
        self._selector: threading.Thread | None = None
        self._cancel = threading.Event()
        self.generation = 0  # bumped at each swap: results name the provider that made them
        self._info = info
        self._spec = spec
        self._budget_key = budget_key
        self.name = name
        self.version = version
        self.inputs: tuple[TensorSpec, ...] = session.inputs
        self.outputs: tuple[TensorSpec, ...] = session.outputs
        self._quantized_inputs = any(s.quantization is not None for s in self.inputs)
        self._quantization = (
            info.onnx.quantization if info.onnx is not None
            else getattr(session, "quantization", "unknown")
        )
        # Re-checking the backend decision (``runtime/recheck.py``): the gate it was made
        # under, and the live latency and load read from the run path every few seconds.
        self._gate = gate
        self._born = time.monotonic()
        self._watch: Watch | None = None
        self._watch_decision()

    # -- identity -------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._info.path

    @property
    def format(self) -> str:
        """``"onnx"`` or ``"tflite"``, from the file's bytes."""
        return self._info.format

    @property
    def sha256(self) -> str:
        return self._info.sha256

    @property
    def size_bytes(self) -> int:
        return self._info.size_bytes

    @property
    def metadata(self) -> dict[str, str]:
        """The ONNX file's ``metadata_props`` (Ultralytics writes ``names``, ``task``, ``imgsz``
        there); empty for TFLite, whose packed metadata ``tasks.labels`` reads."""
        return dict(self._info.onnx.metadata) if self._info.onnx is not None else {}

    @property
    def spec(self) -> SessionSpec:
        """How the session was asked for (a batch variant is opened from it, ``model.batching``)."""
        return self._spec

    @property
    def file_info(self) -> ModelFileInfo:
        """The model file's inspection (format, digest, ONNX graph facts)."""
        return self._info

    @property
    def quantization(self) -> str:
        """``int8-qdq``, ``int8-qoperator``, ``int8-dynamic``, ``int8``, ``float16``, ``float``."""
        return self._quantization

    @property
    def provider(self) -> str:
        """The provider (or TFLite delegate) actually running, after verification."""
        return self._live().provider

    @property
    def report(self) -> LoadReport:
        return self._live().report

    @property
    def closed(self) -> bool:
        return self._session is None

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id with ``isolation="process"`` (None otherwise, or closed)."""
        pid = getattr(self._session, "pid", None)
        return pid if isinstance(pid, int) else None

    # -- running --------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any] | np.ndarray) -> dict[str, np.ndarray]:
        """Run once. ``inputs`` is a dict of name -> array, or a bare array for one input.

        Returns every output by name.

        Raises:
            InvalidInputError: wrong names, shapes or dtypes (the message says what is expected).
            InferenceError: the runtime failed; WorkerCrashedError if an isolated worker died.
            StateError: the model is closed.
        """
        feeds = check_feeds(self.inputs, inputs, accept_float_for_quantized=self._quantized_inputs)
        with self._swap_lock:  # two uncontended lock operations per run: ~0.3 us
            session = self._live()
            self._inflight[id(session)] = self._inflight.get(id(session), 0) + 1
        t = time.perf_counter()
        try:
            return session.run(feeds)
        finally:
            ms = (time.perf_counter() - t) * 1000
            with self._swap_lock:
                self._inflight[id(session)] -= 1
                self._close_retired()
                watch = self._watch
                due = watch is not None and session is self._session and watch.record(ms)
            if due:
                self._poll()

    def _close_retired(self) -> None:
        """(Under ``_swap_lock``.) Close swapped-out sessions nobody is running any more."""
        for old in [s for s in self._retired if not self._inflight.get(id(s))]:
            self._retired.remove(old)
            self._inflight.pop(id(old), None)
            old.close()

    def stop_selecting(self, timeout: float = 30.0) -> None:
        """Stop a background measurement and wait for it (the native libraries must not be
        mid-compile when the process exits). The current session keeps serving."""
        self._cancel.set()
        t = self._selector
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                logger.warning("measuring backends for %s did not stop in %.0f s", self.name,
                               timeout)

    # -- backend selection ------------------------------------------------------------------------
    @property
    def selection(self) -> dict[str, Any] | None:
        """The measuring selector's decision and table (``None`` when it did not run)."""
        return self.report.selection

    @property
    def probe(self) -> bool:
        """Whether this model was loaded to be measured (``load_model(probe=...)``)."""
        return self._spec.probe

    @property
    def selecting(self) -> bool:
        """True while a background measurement is under way."""
        t = self._selector
        return t is not None and t.is_alive()

    def select_backend(self, gate: Gate | None = None, *, background: bool = False,
                       budget_s: float | None = None) -> Decision | None:
        """Measure the candidate backends for this model (see ``load_model(probe=...)``), cache
        the decision and switch to the winner between two runs.

        A cached decision for ``gate`` is applied at once. With ``background`` the measuring
        runs in a daemon thread (``selecting`` tells) and this returns None; the model keeps
        serving meanwhile. Not for ``isolation="process"`` (its worker measures at load).
        """
        if self.worker_pid is not None:
            raise StateError("a model with isolation='process' is measured in its worker at load")
        spec = self._spec
        gate_ = gate or select.OutputsGate()
        self._gate = gate_
        cached = select.load_cached(spec, gate_.key)
        if cached is not None:
            self._adopt(cached, None)
            return cached
        if background:
            if self.selecting:
                return None
            t = threading.Thread(target=self._measure, args=(gate_, budget_s),
                                 name=f"select-{self.name}", daemon=True)
            self._selector = t
            _measuring.add(self)
            t.start()
            return None
        return self._measure(gate_, budget_s)

    def _measure(self, gate: Gate | None, budget_s: float | None,
                 trigger: str | None = None) -> Decision | None:
        """Measure the candidates (or, with ``trigger``, re-check the serving decision's best
        few: ``runtime/remeasure.py``), cache the decision and serve on its winner."""
        spec = self._spec
        gate_ = gate or select.OutputsGate()
        # Sessions opened here beside the serving one (the pick, remeasure's few) are charged
        # to the memory budget; the candidates are measured in a child (runtime/guarded.py).
        opener = self._side_opener()
        try:
            if trigger is None:  # a candidate that crashes the child is a refused row
                decision, session = measure_guarded(spec, gate_, cancel=self._cancel, opener=opener,
                                                    budget_s=budget_s or spec.probe_budget_s)
            else:
                outcome = select.recheck(
                    spec, select.Decision.from_dict(self.report.selection or {}), gate_,
                    trigger=trigger, cancel=self._cancel, opener=opener, measurer=measure_guarded)
                if outcome is None:  # nothing to compare: no longer provisional
                    self._recheck_ended(None, False)
                    return None
                decision, session = outcome.decision, outcome.session
        except select.Cancelled:
            logger.info("measuring backends for %s stopped: the model is closing", self.name)
            self._recheck_ended(None, None)
            return None
        except ModelMemoryError as exc:
            logger.warning("%s backends for %s stopped, %s kept: %s. Raise "
                           "runtime.memory_budget_mb, or set the model's %s: false",
                           "measuring" if trigger is None else "re-checking", self.name,
                           choice.label() if (choice := self.report.choice) else self.provider,
                           exc, "probe" if trigger is None else "recheck.enabled")
            self._recheck_ended(None, None)
            return None
        except Exception as exc:  # a background thread must not die silently
            logger.warning("%s backends for %s failed: %s",
                           "measuring" if trigger is None else "re-checking", self.name, exc)
            self._recheck_ended(None, None)
            return None
        decision.key = decision.key or select.cache_key(spec, gate_.key)
        select.store(spec, decision)
        logger.info("%s: %s %s", self.name, "picked" if trigger is None else "re-checked:",
                    decision.summary())
        self._adopt(decision, session)
        self._watch_decision()
        return decision

    def _side_opener(self, doing: str = "measuring") -> ChargedOpener:
        """Opens a candidate beside the serving session, charged what this model was admitted
        at (the same model on another backend costs about as much) while it is open."""
        mb = process_budget().charged_mb(self._budget_key) or 0.0
        return ChargedOpener(select.open_choice, self.name, mb, doing=doing)

    # -- re-checking the decision (runtime/recheck.py) -------------------------------------------
    def _watch_decision(self) -> None:
        """Watch the serving decision (live latency, load) for a re-check, or update the
        watch after a new decision; nothing when re-checks are off or nothing was measured."""
        selection = self._session.report.selection if self._session is not None else None
        settings = self._spec.recheck
        if not selection or not settings.enabled or not self._spec.probe \
                or self.worker_pid is not None or not selection.get("candidates"):
            return
        picked: dict[str, Any] = next(
            (r for r in selection["candidates"] if r.get("status") == "picked"), {})
        measured = picked.get("p50_ms")
        provisional = bool(selection.get("measured_under_load"))
        if self._watch is None:
            policy = RecheckPolicy(settings, started=self._born, measured_ms=measured,
                                   provisional=provisional)
            self._watch = Watch(policy, poll_s=settings.poll_s)
            if provisional:
                logger.info("%s: the backend decision was measured under load; it is "
                            "re-checked when the box has been idle for %.0f s",
                            self.name, settings.idle_for_s)
        else:
            self._recheck_ended(measured, provisional)

    def _recheck_ended(self, measured_ms: float | None, provisional: bool | None) -> None:
        watch = self._watch
        if watch is not None and watch.policy.running:
            watch.policy.done(measured_ms, watch.policy.provisional if provisional is None
                              else provisional)

    def _poll(self) -> None:
        """(From the run path, every few seconds.) Start a re-check when the policy says so."""
        watch = self._watch
        if watch is None or self.selecting or self._cancel.is_set():
            return
        trigger = watch.poll()
        if trigger is None:
            return
        t = threading.Thread(target=self._measure, args=(self._gate, None, trigger),
                             name=f"recheck-{self.name}", daemon=True)
        self._selector = t
        _measuring.add(self)
        t.start()

    @property
    def rechecks(self) -> int:
        """How many times this process re-checked the backend decision."""
        return self._watch.policy.count if self._watch is not None else 0

    def _adopt(self, decision: Decision, session: Session | None) -> None:
        """Serve on ``decision``'s winner: ``session`` if given (else opened), unless the
        current session already is that choice (then only the report changes)."""
        current = self._session
        if current is None:
            if session is not None:
                session.close()
            return
        if current.report.choice == decision.choice:
            if session is not None:
                session.close()
            select.annotate_decision(current, decision)
            return
        if session is None:
            try:
                session = self._side_opener("switching to")(self._spec, decision.choice)
            except ModelMemoryError as exc:  # the pick is sound: no room for it beside this one
                logger.warning("%s: staying on %s, the picked %s is kept for the next start: %s. "
                               "Raise runtime.memory_budget_mb to switch while serving",
                               self.name, current.provider, decision.choice.label(), exc)
                return
            except EdgeInferError as exc:
                logger.warning("%s: the picked %s does not open (%s); staying on %s", self.name,
                               decision.choice.label(), exc, current.provider)
                select.forget(self._spec, decision.gate)
                return
        if tuple(s.name for s in session.outputs) != tuple(s.name for s in self.outputs):
            logger.warning("%s: %s names its outputs differently; staying on %s", self.name,
                           decision.choice.label(), current.provider)
            session.close()
            return
        if isinstance(session, ChargedSession):  # this model's own charge covers it now
            session = session.detach()
        select.annotate_decision(session, decision)
        session.report.fallbacks[:0] = current.report.fallbacks
        with self._swap_lock:
            if self._session is None:  # closed meanwhile
                session.close()
                return
            old, self._session = self._session, session
            self._retired.append(old)
            self.generation += 1
            self._close_retired()
        logger.info("%s now runs on %s", self.name, decision.choice.label())

    def restart(self) -> None:
        """Start a fresh worker process (``isolation="process"`` only), e.g. after it crashed."""
        session = self._live()
        restart = getattr(session, "restart", None)
        if restart is None:
            raise StateError("restart() needs isolation='process'; this model runs in-process")
        restart()

    def close(self) -> None:
        """Release the session and its share of the memory budget. Idempotent."""
        self.stop_selecting()
        with self._swap_lock:
            session, self._session = self._session, None
            retired, self._retired = self._retired, []
        for old in retired:
            old.close()
        if session is not None:
            session.close()
            process_budget().release(self._budget_key)

    def __enter__(self) -> Model:
        self._live()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _live(self) -> Session:
        if self._session is None:
            raise StateError(f"model {self.name!r} is closed")
        return self._session

    # -- description ----------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """Everything ``edgeinfer info --json`` prints about the model and its session."""
        report = self.report
        d: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "path": str(self.path),
            "format": self.format,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "quantization": self.quantization,
            "inputs": [s.to_dict() for s in self.inputs],
            # the sizes dynamic inputs were fixed to (measured and warmed up at), and from where
            "input_shapes": {k: list(v) for k, v in self._spec.input_shapes.items()},
            "input_shapes_from": self._spec.input_shapes_from,
            "outputs": [s.to_dict() for s in self.outputs],
            "provider": report.provider,
            "fallbacks": [f.to_dict() for f in report.fallbacks],
            "session": report.to_dict(),
        }
        if self._info.onnx is not None:
            graph = self._info.onnx.to_dict()
            d["opset"] = graph["opsets"].get("ai.onnx")
            d["graph"] = graph
        return d

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.provider
        return f"<Model {self.name!r} {self.format} {self.quantization} on {state}>"
