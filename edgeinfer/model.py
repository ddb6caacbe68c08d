"""``load_model`` and ``Model``: the public face of a loaded model, whatever runs it.

Loading is: inspect the file (format from its bytes, sha256, size, safety) -> admit it against the
memory budget by its size -> build the session in-process or in a worker process (provider
chosen and verified, one warm-up run) -> measure what it really costs in resident memory ->
refuse it if that breaks ``memory_limit_mb`` or the process budget (nothing already loaded is
disturbed) -> hand out a ``Model``.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import paths
from .errors import ConfigError, ModelMemoryError, StateError
from .runtime.base import (
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

logger = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_MB = 512.0
ISOLATIONS = ("none", "process")
ARENAS = ("bounded", "off", "default")
# The arena that measured lowest in resident memory with no large slowdown (docs/benchmarks.md).
DEFAULT_ARENA = "bounded"

_load_lock = threading.Lock()  # loads are serialized so resident-memory deltas are this model's
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
        session = self._live()
        feeds = check_feeds(self.inputs, inputs, accept_float_for_quantized=self._quantized_inputs)
        return session.run(feeds)

    def restart(self) -> None:
        """Start a fresh worker process (``isolation="process"`` only), e.g. after it crashed."""
        session = self._live()
        restart = getattr(session, "restart", None)
        if restart is None:
            raise StateError("restart() needs isolation='process'; this model runs in-process")
        restart()

    def close(self) -> None:
        """Release the session and its share of the memory budget. Idempotent."""
        session, self._session = self._session, None
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
    probe: bool = False,
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
        providers: ``"auto"`` (TensorRT > CUDA > accelerated CPU > CPU), or names/aliases in order.
        threads: intra-op threads; default the physical cores, at most 4.
        memory_limit_mb: refuse the model if load + first run cost more resident memory; with
            ``isolation="process"`` also the worker's address-space limit.
        isolation: ``"none"`` or ``"process"`` (a worker subprocess; a crash raises
            ``WorkerCrashed`` and ``Model.restart()`` revives it).
        strict_providers: a fallback from the first provider asked for is an error.
        probe: time and cross-check each working provider, keep the fastest (decision cached).
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
    if arena not in ARENAS:
        raise ConfigError(f"arena must be one of {ARENAS}, got {arena!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    if memory_limit_mb is not None and memory_limit_mb <= 0:
        raise ConfigError(f"memory_limit_mb must be > 0, got {memory_limit_mb!r}")
    wanted = normalize(providers if isinstance(providers, str) else list(providers))
    limit = DEFAULT_MAX_MODEL_MB if max_model_mb is None else max_model_mb
    from .catalog import resolve_model  # the CLI's and the configs' resolver too

    info = inspect_model(resolve_model(path), max_model_mb=limit)
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
        probe=probe,
        input_shapes={k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()},
        arena=arena,
        memory_limit_mb=memory_limit_mb,
        cache_dir=(Path(cache_dir) if cache_dir else paths.cache_dir())
        if optimized_model_cache else None,
        state_dir=Path(state_dir) if state_dir else paths.state_dir(),
        delegates=tuple(_delegate(d) for d in delegates),
        warmup=warmup,
        warmup_inputs=dict(warmup_inputs or {}),
        graph_inputs=dict(info.onnx.inputs) if info.onnx is not None else {},
        external_data=bool(info.onnx is not None and info.onnx.external_data),
    )
    with _load_lock:
        session = _open(spec, isolation, memory_limit_mb, worker_timeout_s, worker_nice)
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
    return Model(session, info, spec, model_name, version, key)


def _open(spec: SessionSpec, isolation: str, memory_limit_mb: float | None,
          timeout_s: float | None, nice: int) -> Session:
    if isolation == "process":
        from .runtime.worker import WorkerSession

        if timeout_s is None:
            return WorkerSession(spec, memory_limit_mb, nice=nice)
        return WorkerSession(spec, memory_limit_mb, start_timeout_s=timeout_s,
                             run_timeout_s=timeout_s, nice=nice)
    from .runtime import open_session

    return open_session(spec)


def _admit(report: LoadReport, name: str, memory_limit_mb: float | None) -> float:
    """The measured cost of load + first run; raises if it breaks the model's own limit."""
    cost = max(report.rss_first_run_mb, report.rss_load_mb, 0.0)
    if memory_limit_mb is not None and cost > memory_limit_mb:
        raise ModelMemoryError(
            f"model {name!r} costs {cost:.1f} MiB of resident memory after load and first run "
            f"(load {report.rss_load_mb:.1f} MiB), over its memory_limit_mb={memory_limit_mb:g}"
        )
    return cost


def _delegate(d: DelegateSpec | Mapping[str, Any] | str) -> DelegateSpec:
    if isinstance(d, DelegateSpec):
        return d
    if isinstance(d, str):
        return DelegateSpec(d)
    try:
        return DelegateSpec(str(d["library"]), {str(k): str(v) for k, v in
                                                  (d.get("options") or {}).items()})
    except KeyError:
        raise ConfigError(f"a delegate needs a 'library': {dict(d)!r}") from None
