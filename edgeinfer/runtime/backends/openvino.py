"""OpenVINO backend: its CPU plugin runs ONNX and TFLite files directly, one exact ``Choice``.

- Configuration: the inference precision is always set (``fp32`` as ``f32``: the CPU plugin's
  own default is bf16 where the CPU has it, which breaks some models), ``INFERENCE_NUM_THREADS``
  from the choice, the ``LATENCY`` hint with one stream (one frame at a time, as edgeinfer runs).
- No CPU pinning (``ENABLE_CPU_PINNING`` off; OpenVINO's default on Linux is on): pinned worker
  threads cannot move off a core that a camera decoder, the MQTT client or another process is
  using, which on a small board turns every busy moment into a latency spike; unpinned, the
  kernel's scheduler moves them.
- Compile cache: ``CACHE_DIR`` is ``spec.cache_dir / "openvino" / precision``; OpenVINO keys the
  blobs on the model and device (threads are applied at load, so one blob serves every thread
  count), and ``LOADED_FROM_CACHE`` says which happened (``report.cache``).
- TFLite files: names, and the quantization of int8/uint8 inputs and outputs, are taken from
  LiteRT's view of the file (OpenVINO exposes the raw integer tensors without their scales), so
  the session takes and returns what the LiteRT session does.

Nothing imports openvino until a session is opened or ``available()`` is asked.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import (
    BackendUnavailableError,
    InferenceError,
    ModelLoadError,
    ModelMemoryError,
    StateError,
)
from ..base import Choice, Dim, LoadReport, SessionSpec, TensorSpec, format_shape
from ..memory import MemoryMeter
from .common import BackendSession, finish_load, importable
from .litert_common import dequantize, import_interpreter, quantization_of, quantize
from .litert_common import tensor_spec as litert_spec

logger = logging.getLogger("edgeinfer.runtime.openvino")  # its name before the move: users filter on it

INSTALL = "pip install 'edgeinfer[openvino]'"
# Choice.precision -> INFERENCE_PRECISION_HINT, and the OPTIMIZATION_CAPABILITIES entry it needs.
_HINTS = {"fp32": ("f32", "FP32"), "bf16": ("bf16", "BF16"), "fp16": ("f16", "FP16")}
# OpenVINO element type names -> edgeinfer dtype names (see runtime/ort_types.py).
_DTYPES = {
    "f32": "float32", "f16": "float16", "f64": "float64", "bf16": "bfloat16",
    "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32",
    "u32": "uint32", "i64": "int64", "u64": "uint64", "boolean": "bool",
}


def _import_ov() -> Any:
    """``import openvino``, without its usage telemetry: importing it sends an event to Google
    Analytics from a forked child (in a multi-threaded daemon, too) unless the user opted out.
    A device must not phone home, so ``openvino_telemetry`` is made unimportable here (unless
    something imported it already) and OpenVINO falls back to its own no-op stub."""
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    try:
        import openvino
    except ImportError as exc:
        raise BackendUnavailableError(f"OpenVINO is not installed: {INSTALL}") from exc
    return openvino


@functools.cache
def _core() -> Any:
    # One Core per process: it loads the device plugins once and owns their thread pools.
    return _import_ov().Core()


def available() -> bool:
    """Whether the ``openvino`` package imports here."""
    return importable(_import_ov)


def version() -> str:
    """OpenVINO's version string (``2026.4.1-22982-...``), part of the selector's cache key."""
    return str(_import_ov().get_version())


@functools.cache
def precisions(device: str = "CPU") -> tuple[str, ...]:
    """The ``Choice.precision`` values ``device`` can infer with on this machine, from its
    ``OPTIMIZATION_CAPABILITIES`` (an x86 CPU with AVX512-BF16/AMX: fp32, bf16, fp16; a
    Cortex-A76: fp32, fp16).

    Raises:
        BackendUnavailableError: openvino is not installed.
    """
    try:
        caps = set(_core().get_property(device, "OPTIMIZATION_CAPABILITIES"))
    except RuntimeError as exc:  # no such device
        logger.debug("OpenVINO device %s: %s", device, exc)
        return ()
    return tuple(p for p, (_, cap) in _HINTS.items() if cap in caps)


class OpenVinoSession(BackendSession):
    """A compiled OpenVINO model and one infer request (the ``Session`` protocol)."""

    def __init__(self, compiled: Any, report: LoadReport, inputs: tuple[TensorSpec, ...],
                 outputs: tuple[TensorSpec, ...], dequantize: bool) -> None:
        self._compiled: Any = compiled
        self._request: Any = compiled.create_infer_request()
        self.report = report
        self.inputs = inputs
        self.outputs = outputs
        self.quantization = "unknown"  # TFLite files: LiteRT's word ("float16", "int8"...)
        self._in = [(i, s.name, s.quantization, np.dtype(s.dtype) if s.quantization else None)
                    for i, s in enumerate(inputs)]
        self._out = [(i, s.name, s.quantization if dequantize else None)
                     for i, s in enumerate(outputs)]

    @property
    def compiled(self) -> Any:
        """The ``openvino.CompiledModel`` (read its properties: threads, precision, cache)."""
        if self._compiled is None:
            raise StateError("the OpenVINO session is closed")
        return self._compiled

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on feeds already checked by ``check_feeds``.

        Inputs are shared with OpenVINO where their layout allows (``share_inputs``: the call
        is synchronous, so the caller's arrays are not touched after it returns); outputs are
        copies, as the request reuses its buffers.

        Raises:
            StateError: the session is closed.
            InferenceError: OpenVINO failed (``ModelMemoryError`` when it ran out of memory).
        """
        request = self._request
        if request is None:
            raise StateError("the OpenVINO session is closed")
        values: dict[int, np.ndarray] = {}
        for i, name, quant, dtype in self._in:
            x = feeds[name]
            if quant is not None and dtype is not None and x.dtype != dtype:
                x = quantize(x, quant, dtype)
            values[i] = x
        try:
            result = request.infer(values, share_inputs=True, share_outputs=False)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise _run_error(exc) from exc
        out: dict[str, np.ndarray] = {}
        for i, name, quant in self._out:
            y = result[i]
            out[name] = y if quant is None else dequantize(y, quant)
        return out

    def close(self) -> None:
        """Release the request and the compiled model. Idempotent."""
        self._request = None
        self._compiled = None


def open_session(spec: SessionSpec) -> OpenVinoSession:
    """Read, reshape and compile ``spec.path`` as ``spec.choice`` says, and warm it up.

    Raises:
        BackendUnavailableError: openvino is not installed.
        ModelLoadError: OpenVINO cannot read or compile the model, or cannot run it as asked
            (a precision the device lacks, string or sequence inputs); the selector skips it.
        ModelMemoryError: out of memory while compiling.
    """
    choice = spec.choice or Choice("openvino", "CPU", "fp32", spec.threads)
    if choice.backend != "openvino":
        raise ModelLoadError(f"the OpenVINO backend was given a {choice.backend} choice")
    core = _core()
    meter = MemoryMeter()
    t0 = time.perf_counter()
    report = LoadReport(backend="openvino", provider=choice.provider, choice=choice,
                        requested=(choice.provider,))
    config = _config(spec, choice)
    name = spec.path.name
    try:
        model = core.read_model(str(spec.path))
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"OpenVINO could not read {name}: {_short(exc)}") from exc
    _reshape(model, spec)
    inputs, outputs, quantization = _specs(model, spec)
    try:
        compiled = core.compile_model(model, choice.device, config)
    except (RuntimeError, ValueError) as exc:
        err = _run_error(exc)
        if isinstance(err, ModelMemoryError):
            raise err from exc
        raise ModelLoadError(
            f"OpenVINO could not compile {name} for {choice.label()}: {_short(exc)}"
        ) from exc
    if spec.cache_dir is not None:
        report.cache = "hit" if compiled.get_property("LOADED_FROM_CACHE") else "miss"
    session = OpenVinoSession(compiled, report, inputs, outputs, spec.dequantize_outputs)
    session.quantization = quantization
    return finish_load(session, spec, meter, t0)


def _config(spec: SessionSpec, choice: Choice) -> dict[str, Any]:
    if choice.precision not in _HINTS:
        raise ModelLoadError(
            f"OpenVINO runs float layers in fp32, bf16 or fp16, not {choice.precision!r}"
        )
    have = precisions(choice.device)
    if choice.precision not in have:
        raise ModelLoadError(
            f"OpenVINO's {choice.device} plugin cannot infer in {choice.precision} on this "
            f"machine (it offers {', '.join(have) or 'nothing'})"
        )
    config: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": _HINTS[choice.precision][0],
        "INFERENCE_NUM_THREADS": str(choice.threads),
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": "1",
        "ENABLE_CPU_PINNING": "NO",
    }
    if spec.cache_dir is not None and not spec.external_data:
        # One folder per precision: OpenVINO's cache key leaves the precision hint out, and a
        # blob compiled for f32 loaded with an f16 hint ran in f32 (2026.4, measured on YOLOv8n;
        # bf16 was re-applied), so an fp32 candidate could be served an fp16 blob and vice versa.
        cache = spec.cache_dir / "openvino" / choice.precision
        cache.mkdir(parents=True, exist_ok=True)
        config["CACHE_DIR"] = str(cache)
    return config


def _reshape(model: Any, spec: SessionSpec) -> None:
    """Fix dynamic input dimensions from ``spec.input_shapes`` (checked as onnx.py checks them)."""
    if not spec.input_shapes:
        return
    ports = {_port_name(p, spec.graph_inputs): p for p in model.inputs}
    new: dict[Any, list[int]] = {}
    for name, shape in spec.input_shapes.items():
        port = ports.get(name)
        if port is None:
            raise ModelLoadError(
                f"input_shapes names {name!r}, but the model's inputs are {sorted(ports)}"
            )
        dims = _dims(port.get_partial_shape())
        if len(dims) != len(shape):
            raise ModelLoadError(
                f"input_shapes[{name!r}] has {len(shape)} dims, the model's input has "
                f"{len(dims)} {format_shape(dims)}"
            )
        if any(isinstance(d, int) and d != v for d, v in zip(dims, shape)):
            raise ModelLoadError(
                f"input_shapes[{name!r}]={list(shape)} conflicts with the model's fixed "
                f"shape {format_shape(dims)}"
            )
        new[port] = [int(v) for v in shape]
    try:
        model.reshape(new)
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(
            f"OpenVINO could not fix the input shapes of {spec.path.name} to "
            f"{dict(spec.input_shapes)}: {_short(exc)}"
        ) from exc


Specs = tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...], str]


def _specs(model: Any, spec: SessionSpec) -> Specs:
    """Inputs, outputs and (TFLite files) how the model is quantized, as LiteRT says."""
    inputs = tuple(_tensor_spec(p, spec, spec.graph_inputs) for p in model.inputs)
    outputs = tuple(_tensor_spec(p, spec, {}) for p in model.outputs)
    if spec.format == "tflite":
        return _litert_view(spec, inputs, outputs)
    return inputs, outputs, "unknown"  # Model takes an ONNX file's from its inspection


def _tensor_spec(port: Any, spec: SessionSpec, declared: Mapping[str, tuple[Dim, ...]]) -> TensorSpec:
    name = _port_name(port, declared)
    type_name = port.get_element_type().get_type_name()
    dtype = _DTYPES.get(type_name)
    if dtype is None:
        raise ModelLoadError(
            f"OpenVINO cannot run {spec.path.name} here: its tensor {name!r} is of type "
            f"{type_name}, which edgeinfer does not pass to OpenVINO (string or untyped tensors)"
        )
    dims = _dims(port.get_partial_shape())
    if name in spec.input_shapes:
        dims = tuple(spec.input_shapes[name])
    elif name in declared and len(declared[name]) == len(dims):
        # keep the file's symbolic names (``batch``) for the dimensions left dynamic
        dims = tuple(d if d is not None else declared[name][i] for i, d in enumerate(dims))
    return TensorSpec(name, dims, dtype)


def _port_name(port: Any, declared: Mapping[str, Any]) -> str:
    """The name the model file gives the tensor (a port can carry several)."""
    names = port.get_names()
    for n in names:
        if n in declared:
            return str(n)
    return str(port.get_any_name())


def _dims(shape: Any) -> tuple[Dim, ...]:
    if shape.rank.is_dynamic:
        return ()
    return tuple(d.get_length() if d.is_static else None for d in shape)


def _litert_view(spec: SessionSpec, inputs: tuple[TensorSpec, ...],
                 outputs: tuple[TensorSpec, ...]) -> Specs:
    """Names and quantization of a TFLite model's inputs and outputs as LiteRT reports them.

    OpenVINO keeps the file's order and names; it drops the scale and zero point of quantized
    inputs and outputs, which the selector needs to compare against LiteRT's float outputs.
    """
    try:
        mod, _ = import_interpreter()
        interp = mod.Interpreter(model_path=str(spec.path))  # not allocated: details only
        in_details, out_details = interp.get_input_details(), interp.get_output_details()
        quantization = quantization_of(interp, in_details, out_details)
        lite_in = [litert_spec(d) for d in in_details]
        lite_out = [litert_spec(d) for d in out_details]
    except BackendUnavailableError:
        if any(s.dtype in ("int8", "uint8") for s in (*inputs, *outputs)):
            raise ModelLoadError(
                f"{spec.path.name} has integer inputs or outputs whose scales only LiteRT reads "
                "here; install ai-edge-litert to run it on OpenVINO"
            ) from None
        return inputs, outputs, "unknown"
    except (ValueError, RuntimeError) as exc:
        raise ModelLoadError(f"LiteRT cannot read {spec.path.name}: {exc}") from exc
    quantized = [s for s in (*lite_in, *lite_out) if s.quantization is not None]
    if not quantized:
        return inputs, outputs, quantization
    if [s.name for s in lite_in] != [s.name for s in inputs] or \
            [s.name for s in lite_out] != [s.name for s in outputs]:
        raise ModelLoadError(
            f"OpenVINO and LiteRT disagree on the inputs/outputs of {spec.path.name}; its "
            "quantized tensors cannot be matched to their scales"
        )
    return (tuple(_with_quant(o, lt) for o, lt in zip(inputs, lite_in)),
            tuple(_with_quant(o, lt) for o, lt in zip(outputs, lite_out)), quantization)


def _with_quant(ov_spec: TensorSpec, lite: TensorSpec) -> TensorSpec:
    if lite.quantization is None:
        return ov_spec
    if ov_spec.dtype != lite.dtype:
        raise ModelLoadError(
            f"OpenVINO exposes the quantized tensor {lite.name!r} as {ov_spec.dtype}, LiteRT as "
            f"{lite.dtype}"
        )
    return TensorSpec(ov_spec.name, ov_spec.shape, ov_spec.dtype, lite.quantization)


def _short(exc: BaseException, limit: int = 400) -> str:
    """OpenVINO's messages start with source locations (``Exception from src/...``)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(("Exception from src", "Check '"))] or lines
    text = " | ".join(lines) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _run_error(exc: BaseException) -> Exception:
    text = _short(exc)
    low = text.lower()
    if "bad_alloc" in low or ("alloc" in low and "memory" in low):
        return ModelMemoryError(f"OpenVINO ran out of memory: {text}")
    return InferenceError(f"OpenVINO failed to run the model: {text}")
