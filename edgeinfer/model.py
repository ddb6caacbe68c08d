"""``load_model`` and ``Model``: the public face of a loaded model, whatever runs it.

Loading is: inspect the file (format from its bytes, sha256, size, safety) -> admit it against the
memory budget by its size -> build the session in-process or in a worker process (provider
chosen and verified, one warm-up run) -> measure what it really costs in resident memory ->
refuse it if that breaks ``memory_limit_mb`` or the process budget (nothing already loaded is
disturbed) -> hand out a ``Model``.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import paths
from . import runtime
from .errors import ConfigError, EdgeInferError, ModelMemoryError, StateError
from .runtime.backends import backend_options
from .runtime.backends.onnx import DEFAULT_ARENA
from .runtime.base import (
    PRECISIONS,
    DelegateSpec,
    LoadReport,
    Session,
    SessionSpec,
    TensorSpec,
    check_feeds,
)
from .runtime.memory import default_threads, process_budget, trim_heap
from .runtime.modelfile import ModelFileInfo, inspect_model
from .runtime.providers import normalize

if TYPE_CHECKING:
    from .runtime.select import Decision, Gate

logger = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_MB = 512.0
ISOLATIONS = ("none", "process")
_load_lock = threading.Lock()  # loads are serialized so resident-memory deltas are this model's
_measuring: weakref.WeakSet[Model] = weakref.WeakSet()  # models measuring in the background


def _stop_measuring() -> None:
    """At exit, stop background measurements first: a native thread pool torn down while a
    session is being compiled aborts the process ("terminate called without an active
    exception")."""
    for model in list(_measuring):
        model.stop_selecting(timeout=30.0)


# threading's exit hooks run before atexit's (which tear backends down, e.g. LiteRT's
# environment): measuring threads are stopped while every backend still stands.
getattr(threading, "_register_atexit", atexit.register)(_stop_measuring)
_ids = itertools.count(1)


class Model:
    """A loaded model on a verified provider. Use as a context manager or call ``close()``.

    Attributes:
        name, version: from the caller (default: the file's stem, ``None``).
        path, format, sha256, size_bytes: the model file.
        inputs, outputs: ``TensorSpec`` per tensor (name, shape, dtype).
        report: how the session was built (provider fallbacks, cache, probe, memory, warm-up).
    """

    def __init__(self, session: Session, info: ModelFileInfo, spec: SessionSpec,
                 name: str, version: str | None, budget_key: int) -> None:
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
        try:
            return session.run(feeds)
        finally:
            with self._swap_lock:
                self._inflight[id(session)] -= 1
                self._close_retired()

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
        from .runtime import select

        if self.worker_pid is not None:
            raise StateError("a model with isolation='process' is measured in its worker at load")
        spec = self._spec
        gate_ = gate or select.OutputsGate()
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

    def _measure(self, gate: Gate, budget_s: float | None) -> Decision | None:
        from .runtime import select

        spec = self._spec
        try:
            decision, session = select.measure(
                spec, gate, budget_s=budget_s or spec.probe_budget_s, cancel=self._cancel)
        except select.Cancelled:
            logger.info("measuring backends for %s stopped: the model is closing", self.name)
            return None
        except Exception as exc:  # a background thread must not die silently
            logger.warning("measuring backends for %s failed: %s", self.name, exc)
            return None
        decision.key = select.cache_key(spec, gate.key)
        select.store(spec, decision)
        logger.info("%s: picked %s", self.name, decision.summary())
        self._adopt(decision, session)
        return decision

    def _adopt(self, decision: Decision, session: Session | None) -> None:
        """Serve on ``decision``'s winner: ``session`` if given (else opened), unless the
        current session already is that choice (then only the report changes)."""
        from .runtime import select

        current = self._session
        if current is None:
            if session is not None:
                session.close()
            return
        if current.report.choice == decision.choice:
            if session is not None:
                session.close()
            select._annotate(current, decision)
            return
        if session is None:
            try:
                session = select.open_choice(self._spec, decision.choice)
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
        select._annotate(session, decision)
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


def load_model(
    path: str | os.PathLike[str],
    *,
    providers: str | Iterable[str] = "auto",
    threads: int | None = None,
    memory_limit_mb: float | None = None,
    isolation: str = "none",
    strict_providers: bool = False,
    probe: bool | str = True,
    precision: str = "fp16",
    probe_budget_s: float = 15.0,
    gate: Gate | str | None = None,
    input_shapes: Mapping[str, Iterable[int]] | None = None,
    arena: str = DEFAULT_ARENA,
    delegates: Iterable[DelegateSpec | Mapping[str, Any] | str] = (),
    warmup: bool = True,
    warmup_inputs: Mapping[str, Any] | None = None,
    max_model_mb: float | None = None,
    name: str | None = None,
    version: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    optimized_model_cache: bool = True,
    worker_timeout_s: float | None = None,
    worker_nice: int = 0,
) -> Model:
    """Load an ONNX or TFLite model (format detected from its bytes) on the best provider.

    Args:
        path: the model file, or an example model's name or file name (``"yolov8n-320"``,
            ``"320n.onnx"``) found in the models cache, pulled into it when missing, as the
            CLI and configs do (``edgeinfer.catalog.resolve_model``).
        providers: ``"auto"``: every backend installed here (onnxruntime and its providers,
            OpenVINO, LiteRT, ARM NN) is a candidate; or names/aliases that narrow the choice
            (``"cpu"``, ``"cuda"``, ``"openvino"``, ``"litert"``, ``"armnn"``...).
        threads: intra-op threads; default the physical cores, at most 4.
        memory_limit_mb: refuse the model if load + first run cost more resident memory; with
            ``isolation="process"`` also the worker's address-space limit.
        isolation: ``"none"`` or ``"process"`` (a worker subprocess; a crash raises
            ``WorkerCrashed`` and ``Model.restart()`` revives it).
        strict_providers: a fallback from the first provider asked for is an error.
        probe: ``True`` (default): on the first load, measure every candidate (backend x
            precision x threads up to ``threads``), refuse those whose outputs differ from the
            fp32 reference, keep the fastest; the decision is cached in ``state_dir``, so later
            loads open the winner at once. ``"background"``: serve at once on the default
            configuration and swap to the winner between runs when measuring ends. ``False``:
            no measuring, onnxruntime (or LiteRT) with its ranked providers.
        precision: the lowest arithmetic a candidate may use: ``"fp32"``, ``"fp16"`` (also
            bf16; default) or ``"int8"``. Every candidate still passes the accuracy gate.
        probe_budget_s: how long measuring may take.
        gate: how candidates are checked against the reference (``runtime.select.Gate``);
            default: every output close (cosine >= 0.9999, error <= 1e-3 of its range).
            Pipelines pass their task's gate (detections, top-1 class). With
            ``probe="background"`` a gate's key alone (``"detect"``) opens a decision cached
            under it; measuring then waits for ``Model.select_backend(gate)``.
        input_shapes: fixed shapes for inputs with dynamic dimensions.
        arena: ``"bounded"``, ``"off"`` or ``"default"`` (ONNX only).
        delegates: TFLite external delegates: library paths or ``{library, options}``.
        warmup: run one inference before returning. It never refuses a model the runtime
            loaded: if the model refuses the made-up feeds (zeros, guessed dynamic dimensions)
            the warm-up is skipped with a warning and ``report.warmup_note``.
        warmup_inputs: values for the warm-up by input name (scalars broadcast), for models
            where zeros are not valid input (e.g. ``{"sr": 16000}``); other inputs get zeros.
            With every input given (and no dimension guessed) a failed warm-up is a
            ``ModelLoadError``.
        max_model_mb: refuse larger files (default 512).
        name, version: identity reported in results (default name: the file's stem).
        state_dir, cache_dir: override the state and cache directories.
        optimized_model_cache: keep the optimized ONNX graph for faster later loads.
        worker_timeout_s: with ``isolation="process"``, a load or a run longer than this kills
            the worker (default: 60 s to load, runs unlimited).
        worker_nice: with ``isolation="process"``, run the worker this much nicer.

    Raises:
        ModelNotFoundError, ModelFormatError, UnsafeModelError, ModelTooLargeError,
        ModelLoadError, ModelMemoryError, ProviderError, ConfigError (bad arguments).
    """
    if isolation not in ISOLATIONS:
        raise ConfigError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    options = backend_options(arena=arena, delegates=delegates)  # each backend checks its own
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    if memory_limit_mb is not None and memory_limit_mb <= 0:
        raise ConfigError(f"memory_limit_mb must be > 0, got {memory_limit_mb!r}")
    if probe not in (True, False, "background"):
        raise ConfigError(f"probe must be true, false or 'background', got {probe!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not probe_budget_s > 0:
        raise ConfigError(f"probe_budget_s must be > 0, got {probe_budget_s!r}")
    if isinstance(gate, str) and probe != "background":
        raise ConfigError("a gate given by its key needs probe='background'")
    wanted = normalize(providers if isinstance(providers, str) else list(providers))
    limit = DEFAULT_MAX_MODEL_MB if max_model_mb is None else max_model_mb
    from .catalog import resolve_model  # the CLI's and the configs' resolver too

    info = inspect_model(resolve_model(path), max_model_mb=limit)
    if input_shapes is None and warmup_inputs is None:
        # An example model's own shapes and warm-up values (as the CLI and configs use them):
        # its dynamic input is fixed to the size it was exported for, so it warms up and
        # its backends can be measured.
        from .catalog import for_path

        entry = for_path(path) or for_path(info.path)
        if entry is not None and entry.sha256 == info.sha256:
            input_shapes = {n: list(d) for n, d in entry.input_shapes} or None
            warmup_inputs = dict(entry.warmup_inputs) or None
    model_name = name or info.path.stem
    budget = process_budget()
    budget.check(model_name, info.size_mb)  # early refusal: the weights alone must fit
    spec = SessionSpec(
        path=info.path.resolve(),
        format=info.format,
        sha256=info.sha256,
        threads=threads or default_threads(),
        providers=wanted,
        strict_providers=strict_providers,
        probe=bool(probe),
        precision=precision,
        probe_budget_s=float(probe_budget_s),
        input_shapes={k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()},
        memory_limit_mb=memory_limit_mb,
        cache_dir=(Path(cache_dir) if cache_dir else paths.cache_dir())
        if optimized_model_cache else None,
        state_dir=Path(state_dir) if state_dir else paths.state_dir(),
        options=options,
        warmup=warmup,
        warmup_inputs=dict(warmup_inputs or {}),
        graph_inputs=dict(info.onnx.inputs) if info.onnx is not None else {},
        external_data=bool(info.onnx is not None and info.onnx.external_data),
    )
    background = probe == "background" and isolation == "none"
    with _load_lock:
        session = _open(spec, isolation, memory_limit_mb, worker_timeout_s, worker_nice,
                        gate, background)
        try:
            cost = _admit(session.report, model_name, memory_limit_mb)
            key = next(_ids)
            budget.charge(key, model_name, cost)
        except ModelMemoryError:
            session.close()
            trim_heap()
            raise
    report = session.report
    logger.info(
        "loaded %s (%s, %s) on %s in %.0f ms, %.1f MiB%s", model_name, info.format,
        info.onnx.quantization if info.onnx else "tflite", report.provider, report.load_ms, cost,
        "" if report.warmed_up else " (not warmed up)",
    )
    model = Model(session, info, spec, model_name, version, key)
    if background and gate is not None and not isinstance(gate, str) \
            and session.report.selection is None:
        model.select_backend(gate, background=True)
    return model


def _open(spec: SessionSpec, isolation: str, memory_limit_mb: float | None,
          timeout_s: float | None, nice: int, gate: Gate | str | None = None,
          background: bool = False) -> Session:
    if background and runtime.measures(spec):
        # A cached decision opens the winner now; otherwise the default serves until
        # ``Model.select_backend`` has measured.
        from .runtime import select

        key = gate if isinstance(gate, str) else (gate or select.OutputsGate()).key
        cached = select.load_cached(spec, key)
        if cached is not None:
            try:
                session = select.open_choice(spec, cached.choice, warmup=spec.warmup)
            except EdgeInferError as exc:
                logger.warning("the cached choice %s for %s no longer opens (%s); measuring "
                               "again", cached.choice.label(), spec.path.name, exc)
            else:
                select._annotate(session, cached)
                return session
        return runtime.open_session(spec.replace(probe=False))
    if isolation == "process":
        from .runtime.worker import WorkerSession

        if timeout_s is None:
            return WorkerSession(spec, memory_limit_mb, nice=nice)
        return WorkerSession(spec, memory_limit_mb, start_timeout_s=timeout_s,
                             run_timeout_s=timeout_s, nice=nice)
    return runtime.open_session(spec, None if isinstance(gate, str) else gate)


def _admit(report: LoadReport, name: str, memory_limit_mb: float | None) -> float:
    """The measured cost of load + first run; raises if it breaks the model's own limit."""
    cost = max(report.rss_first_run_mb, report.rss_load_mb, 0.0)
    if memory_limit_mb is not None and cost > memory_limit_mb:
        raise ModelMemoryError(
            f"model {name!r} costs {cost:.1f} MiB of resident memory after load and first run "
            f"(load {report.rss_load_mb:.1f} MiB), over its memory_limit_mb={memory_limit_mb:g}"
        )
    return cost

