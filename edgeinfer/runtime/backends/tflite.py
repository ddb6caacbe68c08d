"""LiteRT (TFLite) backend: XNNPACK on the CPU, or an external delegate (Edge TPU, ARM NN).

``open_session`` builds a LiteRT interpreter with ``num_threads`` set explicitly (LiteRT's default
is 1), tries the configured delegates in order (or, with ``providers: auto`` and none configured,
the well-known ones found on the device), falls back to XNNPACK with a recorded ``Fallback``, and
warms the session up. Quantized int8/uint8 inputs take float arrays; quantized outputs come back
as float32 unless ``dequantize_outputs`` is off.

With ``spec.choice`` set (the measuring selector, ``runtime/select.py``) exactly that runs and
nothing falls back: ``device="xnnpack"`` at ``choice.threads`` in fp32 (the interpreter), or in
fp16 (XNNPACK's ``FORCE_FP16`` flag, reachable from Python only through LiteRT's
``CompiledModel`` API, offered by :func:`precisions` where the CPU has FP16 arithmetic), or one
delegate library; a failure is a ``ModelLoadError`` the selector records.

Corrupt files: LiteRT 2.3's interpreter builds from a file with ``VerifyAndBuildFromFile`` (the
flatbuffers verifier) and its ``InterpreterBuilder`` bounds-checks tensor, buffer, opcode and
subgraph indices and constant sizes. Truncated copies, random bytes behind a ``TFL3`` header and
~600 byte-flipped mutants of real and tiny models all raised ``ValueError``/``RuntimeError`` in a
subprocess, none crashed. So no Python-side flatbuffer walk is done (it would be slow for large
models and duplicate the native verifier); only a cheap header check for a clear message.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..._stderr import native_logs_to_debug  # "INFO: Created TensorFlow Lite XNNPACK ..."
from ...errors import (
    ConfigError,
    InferenceError,
    ModelFormatError,
    ModelLoadError,
    ProviderFallbackError,
    StateError,
)
from .. import memory
from ..base import Choice, DelegateSpec, Fallback, LoadReport, Session, SessionSpec
from . import own_options
from .common import BackendSession, finish_load, importable
from .delegates import KNOWN_DELEGATES, check_plugin, delegate_name, find_delegates
from .litert_common import (
    check_header,
    check_input_shape,
    dequantize,
    error_text,
    import_interpreter,
    model_error,
    quantization_of,
    quantize,
    runtime_version,
    tensor_spec,
    tflite_quantization,
)
from .litert_fp16 import CompiledSession

__all__ = ["CPU_PROVIDER", "LiteRTOptions", "TFLiteSession", "available", "delegate_libraries",
           "make_options", "open_session", "precisions", "runtime_version", "tflite_quantization"]

logger = logging.getLogger("edgeinfer.runtime.tflite")  # its name before the move: users filter on it

# The default op resolver applies XNNPACK; with BUILTIN_WITHOUT_DEFAULT_DELEGATES (never used here)
# the plain kernels would run and the provider would be "litert-cpu".
CPU_PROVIDER = "xnnpack"


@dataclass(frozen=True, slots=True)
class LiteRTOptions:
    """LiteRT's own options (``SessionSpec.options["litert"]``).

    Attributes:
        delegates: external delegates to try, in order (none: with ``providers: auto``, the
            well-known ones found on the device).
    """

    delegates: tuple[DelegateSpec, ...] = ()

    def decision_key(self) -> dict[str, Any]:
        # the configured delegates are candidates (or, none configured, the discovered ones)
        return {"delegates": [d.library for d in self.delegates]}


def make_options(*, delegates: Iterable[DelegateSpec | Mapping[str, Any] | str] = ()
                 ) -> LiteRTOptions:
    """The ``delegates`` keyword of ``load_model`` (library paths, ``{library, options}``
    mappings or ``DelegateSpec``s) as LiteRT's options.

    Raises:
        ConfigError: a mapping without ``library``.
    """
    return LiteRTOptions(tuple(_delegate(d) for d in delegates))


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


def delegate_libraries(spec: SessionSpec) -> list[str]:
    """The delegate libraries worth measuring for ``spec``: the configured ones, else those
    found on the device."""
    configured = own_options(spec, "litert", LiteRTOptions).delegates
    return [d.library for d in configured or find_delegates()]


class TFLiteSession(BackendSession):
    """A LiteRT interpreter behind the ``Session`` protocol. One caller at a time.

    Attributes:
        inputs: name, shape (``None`` for a dynamic dimension), dtype and quantization per input.
        outputs: the same per output; a quantized output reads as float32 when dequantized.
        report: how the session was built (provider, fallbacks, timings, memory).
        quantization: ``"int8"``, ``"int8-dynamic"``, ``"float16"`` or ``"float"``.
        threads: the ``num_threads`` the interpreter was built with.
    """

    def __init__(
        self, interpreter: Any, report: LoadReport, threads: int, dequantize: bool
    ) -> None:
        self._interp: Any = interpreter
        self.report = report
        self.threads = threads
        in_details = interpreter.get_input_details()
        out_details = interpreter.get_output_details()
        self.inputs = tuple(tensor_spec(d) for d in in_details)
        self.outputs = tuple(tensor_spec(d) for d in out_details)
        # Per-frame plans, precomputed: (name, index, dtype, quantization) and current shapes.
        self._in = [
            (s.name, int(d["index"]), np.dtype(d["dtype"]), s.quantization)
            for s, d in zip(self.inputs, in_details)
        ]
        self._shapes: dict[int, tuple[int, ...] | None] = {
            int(d["index"]): tuple(int(n) for n in d["shape"]) for d in in_details
        }
        self._out = [
            (s.name, int(d["index"]), s.quantization if dequantize else None)
            for s, d in zip(self.outputs, out_details)
        ]
        self.quantization = quantization_of(interpreter, in_details, out_details)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on feeds already checked by ``check_feeds(..., accept_float_for_quantized=True)``.

        Raises:
            StateError: the session is closed.
            InferenceError: LiteRT failed.
        """
        interp = self._interp
        if interp is None:
            raise StateError("the TFLite session is closed")
        try:
            for name, index, dtype, quant in self._in:
                x = feeds[name]
                if quant is not None and x.dtype != dtype:
                    x = quantize(x, quant, dtype)
                if x.shape != self._shapes[index]:
                    self._shapes[index] = None  # unknown until the resize has succeeded
                    interp.resize_tensor_input(index, x.shape, strict=True)
                    interp.allocate_tensors()
                    self._shapes[index] = x.shape
                interp.set_tensor(index, x)
            interp.invoke()
            out: dict[str, np.ndarray] = {}
            for name, index, quant in self._out:
                y = interp.get_tensor(index)
                out[name] = y if quant is None else dequantize(y, quant)
            return out
        except (ValueError, RuntimeError) as exc:
            raise InferenceError(f"LiteRT failed to run the model: {error_text(exc)}") from exc

    def close(self) -> None:
        """Release the interpreter (and its delegate). Idempotent."""
        self._interp = None


def _build(mod: Any, spec: SessionSpec, threads: int, delegates: list[Any]) -> Any:
    with native_logs_to_debug():
        interp = mod.Interpreter(
            model_path=str(spec.path), num_threads=threads,
            experimental_delegates=delegates or None)
        details = {d["name"]: d for d in interp.get_input_details()}
        for name, shape in spec.input_shapes.items():
            check_input_shape(details, name, shape)
            interp.resize_tensor_input(details[name]["index"], list(shape), strict=True)
        interp.allocate_tensors()
    return interp


def _fallback(report: LoadReport, spec: SessionSpec, library: str, exc: Exception) -> None:
    reason = error_text(exc)
    if spec.strict_providers:
        raise ProviderFallbackError(
            f"delegate {library} could not run {spec.path} and strict_providers is on: {reason}"
        ) from exc
    report.fallbacks.append(Fallback(provider=library, reason=reason))
    logger.warning(
        "TFLite delegate %s unavailable, falling back to %s: %s", library, CPU_PROVIDER, reason
    )


def _open_interpreter(mod: Any, spec: SessionSpec, threads: int, report: LoadReport) -> Any:
    configured = own_options(spec, "litert", LiteRTOptions).delegates
    candidates: tuple[DelegateSpec, ...]
    if configured:
        candidates = configured
    elif "auto" in spec.providers:
        candidates = find_delegates()
    else:
        candidates = ()
    report.requested = (*(delegate_name(d.library) for d in candidates), CPU_PROVIDER)
    for d in candidates:
        try:
            check_plugin(d.library)
            delegate = mod.load_delegate(d.library, dict(d.options) or None)
        except (ValueError, RuntimeError, OSError, AttributeError) as exc:
            _fallback(report, spec, d.library, exc)
            continue
        try:
            interp = _build(mod, spec, threads, [delegate])
        except ConfigError:
            raise
        except (ValueError, RuntimeError) as exc:
            err = model_error(spec, exc)
            if isinstance(err, ModelFormatError):
                raise err from exc
            _fallback(report, spec, d.library, exc)
            continue
        report.provider = delegate_name(d.library)
        return interp
    try:
        interp = _build(mod, spec, threads, [])
    except (ValueError, RuntimeError) as exc:
        raise model_error(spec, exc) from exc
    report.provider = CPU_PROVIDER
    return interp


def open_session(spec: SessionSpec) -> Session:
    """Build, verify and (with ``spec.warmup``) warm a LiteRT session for ``spec.path``:
    ``spec.choice`` exactly when set, else XNNPACK behind the configured or discovered delegates.

    Raises:
        BackendUnavailableError: neither ai-edge-litert nor tflite-runtime is installed.
        ModelNotFoundError, ModelFormatError, ModelLoadError: the file cannot be used.
        ConfigError: ``input_shapes`` names an unknown input or does not fit it.
        ProviderFallbackError: a delegate failed and ``strict_providers`` is on.
    """
    mod, _ = import_interpreter()
    start = time.perf_counter()
    meter = memory.MemoryMeter()
    check_header(spec)
    if spec.choice is not None:
        return _open_choice(mod, spec, spec.choice, start, meter)
    threads = spec.threads if spec.threads > 0 else memory.default_threads()
    report = LoadReport(backend="tflite")
    interp = _open_interpreter(mod, spec, threads, report)
    return finish_load(TFLiteSession(interp, report, threads, spec.dequantize_outputs), spec,
                       meter, start)


# --- one exact Choice (the measuring selector) ---------------------------------------------------


def available() -> bool:
    """Whether ai-edge-litert (or tflite-runtime) imports here."""
    return importable(import_interpreter)


def version() -> str:
    """The LiteRT runtime's version (ai-edge-litert's, or tflite-runtime's).

    Raises:
        BackendUnavailableError: neither is installed.
    """
    return runtime_version()[1]


@functools.cache
def precisions() -> tuple[str, ...]:
    """The ``Choice.precision`` values LiteRT's XNNPACK runs here: ``fp32``, and ``fp16`` where
    the CPU has FP16 arithmetic (Arm ``asimdhp``: a Pi 5's Cortex-A76, not a Pi 4's A72; x86
    ``avx512_fp16``) and the installed ai-edge-litert has the ``CompiledModel`` API whose CPU
    options take XNNPACK flags (the ``Interpreter`` API has no way to ask for FP16)."""
    if not available() or not _cpu_has_fp16():
        return ("fp32",)
    try:
        from ai_edge_litert import compiled_model  # noqa: F401
        from ai_edge_litert.options import CpuOptions
    except ImportError:
        return ("fp32",)
    if "xnnpack_flags" not in getattr(CpuOptions, "__dataclass_fields__", {}):
        return ("fp32",)
    return ("fp32", "fp16")


def _cpu_has_fp16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return bool({"asimdhp", "avx512_fp16"} & set(value.split()))
    return False


def _open_choice(mod: Any, spec: SessionSpec, choice: Choice, start: float,
                 meter: memory.MemoryMeter) -> Session:
    if choice.backend != "litert":
        raise ModelLoadError(f"the LiteRT backend was given a {choice.backend} choice")
    report = LoadReport(backend="litert", provider=choice.provider, choice=choice,
                        requested=(choice.provider,))
    session: Session
    if choice.device == CPU_PROVIDER and choice.precision == "fp16":
        if "fp16" not in precisions():
            raise ModelLoadError("LiteRT cannot run fp16 here: the CPU has no FP16 arithmetic "
                                 "or ai-edge-litert lacks the CompiledModel API")
        session = CompiledSession(mod, spec, choice.threads, report)
    elif choice.device == CPU_PROVIDER:
        if choice.precision != "fp32":
            raise ModelLoadError(f"LiteRT's XNNPACK runs fp32 or fp16, not {choice.precision!r}")
        try:
            interp = _build(mod, spec, choice.threads, [])
        except (ValueError, RuntimeError) as exc:
            raise model_error(spec, exc) from exc
        session = TFLiteSession(interp, report, choice.threads, spec.dequantize_outputs)
    else:
        interp = _build_with_delegate(mod, spec, choice)
        session = TFLiteSession(interp, report, choice.threads, spec.dequantize_outputs)
    return finish_load(session, spec, meter, start)


def _build_with_delegate(mod: Any, spec: SessionSpec, choice: Choice) -> Any:
    """The interpreter with exactly the delegate ``choice.device``, options from
    LiteRT's options or the well-known defaults; no fallback."""
    library = choice.device
    configured = own_options(spec, "litert", LiteRTOptions).delegates
    options = next((dict(d.options) for d in configured if d.library == library), None)
    if options is None:
        options = next((dict(o) for f, _, _, o in KNOWN_DELEGATES
                        if delegate_name(library) == delegate_name(f)), {})
    try:
        check_plugin(library)
        delegate = mod.load_delegate(library, options or None)
    except (ValueError, RuntimeError, OSError, AttributeError) as exc:
        raise ModelLoadError(f"delegate {library} cannot be loaded: {error_text(exc)}") from exc
    try:
        return _build(mod, spec, choice.threads, [delegate])
    except (ValueError, RuntimeError) as exc:
        err = model_error(spec, exc)
        if isinstance(err, ModelFormatError):
            raise err from exc
        raise ModelLoadError(f"delegate {library} could not run {spec.path.name}: "
                             f"{error_text(exc)}") from exc
