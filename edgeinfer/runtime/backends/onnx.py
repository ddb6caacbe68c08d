"""ONNX backend: onnxruntime sessions tuned for a small device, on a verified provider.

- Threads: intra-op as asked (default physical cores, at most 4), inter-op 1, sequential
  execution, spinning off (an idle Pi should idle) unless the measured ``Choice`` turns it on.
- Graph optimization: ``ORT_ENABLE_ALL`` (the NCHWc layout transforms of the CPU provider are
  worth 1.3-1.5x on convolution models) unless a ``Choice`` names another level.
- Memory (its own option, ``OnnxOptions.arena``): ``"bounded"`` uses one process-wide CPU
  arena capped at ``max_mem`` that grows only as requested (``session.use_env_allocators``)
  with initializers kept out of it; ``"off"`` disables the arena; ``"default"`` leaves
  onnxruntime's growing arena.
- Optimized-model cache: on the CPU provider, the graph optimized once is saved under a key
  (model sha256, onnxruntime version, provider, machine, CPU features, optimization level) and
  later loads use it with optimization off, cutting cold start. The layout transforms of
  ``ORT_ENABLE_ALL`` are specific to the CPU they ran on, hence the CPU features in the key.
- Provider verification: onnxruntime falls back silently (an unavailable provider is a warning,
  a failing one is retried on CPU), so each candidate's session is checked with
  ``get_providers()[0]``; a mismatch is a recorded fallback, an error with ``strict_providers``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import (
    BackendUnavailableError,
    ConfigError,
    ModelLoadError,
    ProviderFallbackError,
    StateError,
)
from . import own_options
from ..base import Choice, Fallback, LoadReport, SessionSpec, format_shape
from ..memory import MemoryMeter, process_budget
from .common import BackendSession, finish_load, importable
from .ort_log import onnxruntime_quiet
from .ort_types import load_error, run_error, spec_of
from ..providers import (
    CPU,
    Candidate,
    ProviderContext,
    cpu_features_digest,
    detect_platform,
    provider_options,
    rank_providers,
    skipped_providers,
)

logger = logging.getLogger("edgeinfer.runtime.onnx")  # its name before the move: users filter on it

# Providers whose sessions can be saved as an optimized model (no compiled nodes).
_CACHEABLE = {CPU}
DEFAULT_OPT = "all"
_OPT_LEVELS = {"all": "ORT_ENABLE_ALL", "extended": "ORT_ENABLE_EXTENDED",
               "basic": "ORT_ENABLE_BASIC", "off": "ORT_DISABLE_ALL"}

_env_arena_lock = threading.Lock()
_env_arena_registered = False

ARENAS = ("bounded", "off", "default")
# The arena that measured lowest in resident memory with no large slowdown (docs/benchmarks.md).
DEFAULT_ARENA = "bounded"


@dataclass(frozen=True, slots=True)
class OnnxOptions:
    """onnxruntime's own options (``SessionSpec.options["onnxruntime"]``).

    Attributes:
        arena: ``"bounded"`` (one process-wide CPU arena capped by the memory budget),
            ``"off"`` or ``"default"`` (onnxruntime's own growing arena).
    """

    arena: str = DEFAULT_ARENA

    def __post_init__(self) -> None:
        if self.arena not in ARENAS:
            raise ConfigError(f"arena must be one of {ARENAS}, got {self.arena!r}")

    def decision_key(self) -> dict[str, Any]:
        # The arena changes resident memory, not which candidates there are or which is the
        # fastest correct one; cached decisions were keyed without it.
        return {}


def make_options(*, arena: str = DEFAULT_ARENA) -> OnnxOptions:
    """The ``arena`` keyword of ``load_model`` as onnxruntime's options.

    Raises:
        ConfigError: an arena not in ``ARENAS``.
    """
    return OnnxOptions(arena)


def import_ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailableError(
            "onnxruntime is not installed: pip install onnxruntime (onnxruntime-gpu on NVIDIA)"
        ) from exc
    return onnxruntime


def available() -> bool:
    """Whether onnxruntime (or onnxruntime-gpu) imports here."""
    return importable(import_ort)


def version() -> str:
    """onnxruntime's version (``1.22.0``).

    Raises:
        BackendUnavailableError: onnxruntime is not installed.
    """
    return str(import_ort().__version__)


def precisions() -> tuple[str, ...]:
    """``fp32``, and ``int8``: a float model's weights quantized by edgeinfer at load
    (activations per run); a quantized model's own layers run as the file says."""
    return ("fp32", "int8")


class OnnxSession(BackendSession):
    """A verified, warmed onnxruntime session (the ``Session`` protocol)."""

    def __init__(self, sess: Any, spec: SessionSpec, report: LoadReport) -> None:
        self._sess: Any = sess
        self.report = report
        self.inputs = tuple(spec_of(a, spec.input_shapes) for a in sess.get_inputs())
        self.outputs = tuple(spec_of(a, {}) for a in sess.get_outputs())
        self._output_names = [o.name for o in self.outputs]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sess = self._sess
        if sess is None:
            raise StateError("the session is closed")
        try:
            values = sess.run(self._output_names, feeds)
        except Exception as exc:  # onnxruntime raises its own pybind classes
            raise run_error(exc) from exc
        return dict(zip(self._output_names, values))

    def close(self) -> None:
        self._sess = None


def open_session(spec: SessionSpec) -> OnnxSession:
    """Create the session on the best provider that really runs, warm it up, report how.

    Raises:
        ModelLoadError: onnxruntime refused the model on every candidate.
        ProviderFallbackError: ``strict_providers`` and the first choice did not run.
    """
    ort = import_ort()
    meter = MemoryMeter()
    t0 = time.perf_counter()
    platform = detect_platform()
    available = ort.get_available_providers()
    choice = spec.choice
    if choice is not None:  # exactly this configuration: no fallback (the selector rejects it)
        if choice.backend != "onnxruntime":
            raise ModelLoadError(f"the onnxruntime backend cannot open {choice.label()}")
        if choice.device not in available:
            raise ProviderFallbackError(
                f"{choice.device} is not available in this onnxruntime build")
        context = ProviderContext(spec.state_dir, choice.threads, spec.memory_limit_mb)
        candidates = [Candidate(choice.device, provider_options(choice.device, platform, context))]
        spec = spec.replace(strict_providers=True)
    else:
        context = ProviderContext(spec.state_dir, spec.threads, spec.memory_limit_mb)
        candidates = rank_providers(available, spec.providers, platform, context)
    report = LoadReport(
        backend="onnxruntime", requested=tuple(c.name for c in candidates), isolation="none"
    )
    if choice is None:
        report.fallbacks.extend(skipped_providers(available, spec.providers, platform))
    if spec.strict_providers and report.fallbacks:
        raise ProviderFallbackError(_fallback_message(report.fallbacks))

    sess = None
    for i, cand in enumerate(candidates):
        try:
            sess = _create(ort, spec, cand, report)
        except ModelLoadError as exc:
            if cand.name == CPU or i == len(candidates) - 1:
                raise
            report.fallbacks.append(Fallback(cand.name, str(exc)))
            logger.warning("provider %s failed for %s: %s", cand.name, spec.path.name, exc)
            continue
        running = sess.get_providers()[0]
        if running != cand.name:
            report.fallbacks.append(
                Fallback(cand.name, f"onnxruntime fell back to {running} (see its log)")
            )
            logger.warning("provider %s did not take %s: running on %s", cand.name,
                           spec.path.name, running)
            if spec.strict_providers:
                raise ProviderFallbackError(_fallback_message(report.fallbacks))
        report.provider = running
        report.choice = choice or Choice("onnxruntime", running, "fp32", _threads(spec),
                                         DEFAULT_OPT, False)
        break
    if spec.strict_providers and report.fallbacks:
        raise ProviderFallbackError(_fallback_message(report.fallbacks))
    return finish_load(OnnxSession(sess, spec, report), spec, meter, t0)


def _fallback_message(fallbacks: list[Fallback]) -> str:
    why = "; ".join(f"{f.provider}: {f.reason}" for f in fallbacks)
    return f"strict_providers is on and the provider asked for is not running ({why})"


def _threads(spec: SessionSpec) -> int:
    return spec.choice.threads if spec.choice is not None else spec.threads


def _opt(spec: SessionSpec) -> str:
    return spec.choice.opt or DEFAULT_OPT if spec.choice is not None else DEFAULT_OPT


def session_options(ort: Any, spec: SessionSpec, provider: str) -> Any:
    """SessionOptions for a small device; public so benchmarks build the raw baseline alike."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1 if provider == "XnnpackExecutionProvider" else _threads(spec)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    spin = "1" if spec.choice is not None and spec.choice.spin else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # Every failure reaches the caller as a typed error and every fallback is in the report, so
    # onnxruntime's own console log stays quiet unless debugging.
    so.log_severity_level = 1 if logger.isEnabledFor(logging.DEBUG) else 4
    arena = own_options(spec, "onnxruntime", OnnxOptions).arena
    if arena == "off":
        so.enable_cpu_mem_arena = False
    elif arena == "bounded":
        _register_env_arena(ort)
        so.add_session_config_entry("session.use_env_allocators", "1")
        so.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    return so


def _register_env_arena(ort: Any) -> None:
    """One CPU arena for the whole process, capped by the memory budget, growing as requested."""
    global _env_arena_registered
    with _env_arena_lock:
        if _env_arena_registered:
            return
        budget = process_budget().limit_mb
        cfg = ort.OrtArenaCfg({
            "max_mem": int(budget * 1024 * 1024) if budget else 0,  # 0: no cap
            "arena_extend_strategy": 1,  # kSameAsRequested
            "initial_chunk_size_bytes": 1 << 20,
            "max_dead_bytes_per_chunk": -1,
        })
        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                                 ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, cfg)
        _env_arena_registered = True


def _create(ort: Any, spec: SessionSpec, cand: Candidate, report: LoadReport) -> Any:
    so = session_options(ort, spec, cand.name)
    _apply_shape_overrides(so, spec)
    providers = [(cand.name, cand.options)]
    if cand.name != CPU:
        providers.append((CPU, {}))
    model_path = str(spec.path)
    if spec.choice is not None and spec.choice.precision == "int8":
        model_path = str(_dynamic_int8(spec))
    cache_path = _cache_path(ort, spec, cand.name)
    if cache_path is not None and cache_path.is_file():
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            sess = ort.InferenceSession(str(cache_path), so, providers=providers)
            report.cache = "hit"
            return sess
        except Exception as exc:  # a torn or stale cache entry: drop it, build from the model
            logger.warning("optimized-model cache %s unusable (%s); rebuilding", cache_path, exc)
            cache_path.unlink(missing_ok=True)
            so = session_options(ort, spec, cand.name)
            _apply_shape_overrides(so, spec)
    opt = _opt(spec)
    if opt not in _OPT_LEVELS:
        raise ModelLoadError(f"unknown onnxruntime optimization level {opt!r}")
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[opt])
    tmp = None
    if cache_path is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(f"{cache_path.name}.{os.getpid()}.tmp")
        so.optimized_model_filepath = str(tmp)
    try:
        sess = ort.InferenceSession(model_path, so, providers=providers)
    except Exception as exc:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise load_error(exc, spec.path.name) from exc
    if tmp is not None and cache_path is not None:
        try:
            os.replace(tmp, cache_path)  # atomic: a reader sees the old entry or the whole new one
            report.cache = "miss"
        except OSError as exc:
            report.cache = "error"
            logger.warning("could not store optimized model in %s: %s", cache_path, exc)
    return sess


def _apply_shape_overrides(so: Any, spec: SessionSpec) -> None:
    """Fix dynamic dimensions by name (``add_free_dimension_override_by_name``), so onnxruntime
    plans memory for the real shape and the warm-up runs the shape that will be served.

    A name is fixed only when every position it stands for gets the same value, over every
    input: exporters name unrelated dimensions alike (``['', 3, '?', '?']`` for a 48x192 text
    line), and fixing ``?`` to 48 would refuse every 192-wide input. Such dimensions stay
    dynamic: onnxruntime takes the real size at each run."""
    wanted: dict[str, set[int]] = {}
    for name, shape in spec.input_shapes.items():
        for dim, value in zip(spec.graph_inputs.get(name, ()), shape):
            if isinstance(dim, str):
                wanted.setdefault(dim, set()).add(int(value))
    for name, shape in spec.input_shapes.items():
        dims = spec.graph_inputs.get(name)
        if dims is None:
            raise ModelLoadError(
                f"input_shapes names {name!r}, but the model's inputs are "
                f"{sorted(spec.graph_inputs)}"
            )
        if len(dims) != len(shape):
            raise ModelLoadError(
                f"input_shapes[{name!r}] has {len(shape)} dims, the model's input has "
                f"{len(dims)} {format_shape(dims)}"
            )
        for dim, value in zip(dims, shape):
            if isinstance(dim, str):
                if dim.isidentifier() and len(wanted[dim]) == 1:
                    so.add_free_dimension_override_by_name(dim, int(value))
            elif isinstance(dim, int) and dim > 0 and dim != value:
                raise ModelLoadError(
                    f"input_shapes[{name!r}]={list(shape)} conflicts with the model's fixed "
                    f"shape {format_shape(dims)}"
                )


def _cache_path(ort: Any, spec: SessionSpec, provider: str) -> Path | None:
    if spec.cache_dir is None or provider not in _CACHEABLE or spec.external_data:
        return None
    opt = _opt(spec)
    if opt in ("off", "basic"):  # nothing to save (the selector's reference runs at "basic")
        return None
    shapes = ";".join(f"{k}={list(v)}" for k, v in sorted(spec.input_shapes.items()))
    # "fixed2": which dimensions are fixed by name changed (same-named dims of different sizes
    # stay dynamic); an entry of the old rule would refuse the inputs it was not fixed for.
    shapes += "|fixed2"
    precision = spec.choice.precision if spec.choice is not None else "fp32"
    key = "|".join([spec.sha256, precision, ort.__version__, provider, os.uname().machine,
                    cpu_features_digest(), opt, shapes])
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return spec.cache_dir / "onnx" / f"{spec.path.stem}-{digest}.ort.onnx"


def _dynamic_int8(spec: SessionSpec) -> Path:
    """The model with its float MatMul/Gemm/Conv weights quantized to int8 by onnxruntime's
    dynamic quantization (activations quantized per run): the ``int8`` choice a float model gets
    with ``precision: int8``. Made once per model in the cache directory (atomically)."""
    if spec.cache_dir is None or spec.external_data:
        raise ModelLoadError("int8 dynamic quantization needs the cache directory and a "
                             "single-file model")
    target = spec.cache_dir / "onnx" / f"{spec.path.stem}-{spec.sha256[:16]}-dynamic-int8.onnx"
    if target.is_file():
        return target
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp.onnx")
    try:
        with onnxruntime_quiet(logger):  # its advice to pre-process goes to debug
            quantize_dynamic(str(spec.path), str(tmp), weight_type=QuantType.QInt8)
        os.replace(tmp, target)
    except Exception as exc:  # onnxruntime.quantization's own errors: the candidate fails
        raise ModelLoadError(f"dynamic int8 quantization of {spec.path.name} failed: {exc}"
                             ) from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target
