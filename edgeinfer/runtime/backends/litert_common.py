"""What the LiteRT (TFLite) backends share: importing the interpreter, reading a model's tensors
and quantization, quantizing inputs, and turning LiteRT's errors into ours.

Used by the interpreter backend (``tflite.py``), its fp16 ``CompiledModel`` variant
(``litert_fp16.py``), and the backends that run TFLite files through other engines (OpenVINO,
ARM NN).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import (
    BackendUnavailableError,
    ConfigError,
    ModelFormatError,
    ModelLoadError,
    ModelNotFoundError,
)
from ..base import SessionSpec, TensorSpec

__all__ = ["check_header", "check_input_shape", "dequantize", "error_text", "import_interpreter",
           "model_error", "quantization_of", "quantize", "runtime_version", "tensor_spec",
           "tflite_quantization"]

_QUANTIZED_KINDS = ("int8", "uint8")


def runtime_version() -> tuple[str, str]:
    """The TFLite runtime module in use and its version, e.g. ``("ai_edge_litert", "2.3.0")``.

    Raises:
        BackendUnavailableError: neither ai-edge-litert nor tflite-runtime is installed.
    """
    _, package = import_interpreter()
    return package, str(getattr(sys.modules.get(package), "__version__", "unknown"))


def tflite_quantization(
    tensors: Sequence[Mapping[str, Any]],
    inputs: Sequence[Mapping[str, Any]] = (),
    outputs: Sequence[Mapping[str, Any]] = (),
    ops: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """How a TFLite model is quantized, from the interpreter's tensor (and op) details.

    Returns:
        ``"int8"`` when activations are int8/uint8 (full integer quantization),
        ``"int8-dynamic"`` when only weights are int8 and activations float (dynamic range),
        ``"float16"`` when float16 weights are dequantized at load, else ``"float"``.
    """
    quantized = {t["index"] for t in tensors if _kind(t) in _QUANTIZED_KINDS and _scaled(t)}
    # An int32 tensor with a scale is the bias of an integer conv/fc: only full-int8 models have it.
    if any(_kind(t) == "int32" and _scaled(t) for t in tensors):
        return "int8"
    if quantized:
        activations = {t["index"] for t in (*inputs, *outputs)}
        if ops is not None:
            activations.update(int(i) for op in ops for i in op["outputs"])
        return "int8" if quantized & activations else "int8-dynamic"
    if any(_kind(t) == "float16" for t in tensors):
        return "float16"
    return "float"


def _kind(detail: Mapping[str, Any]) -> str:
    return str(np.dtype(detail["dtype"]).name)


def _scaled(detail: Mapping[str, Any]) -> bool:
    scales = detail.get("quantization_parameters", {}).get("scales")
    if scales is not None and len(scales):
        return bool(np.any(scales != 0))
    return bool(detail.get("quantization", (0.0, 0))[0])


def tensor_spec(detail: Mapping[str, Any]) -> TensorSpec:
    sig = detail.get("shape_signature")
    dims = detail["shape"] if sig is None or len(sig) != len(detail["shape"]) else sig
    scale, zero_point = detail.get("quantization", (0.0, 0))
    return TensorSpec(
        name=str(detail["name"]),
        shape=tuple(None if int(d) < 0 else int(d) for d in dims),
        dtype=np.dtype(detail["dtype"]).name,
        quantization=(float(scale), int(zero_point)) if scale else None,
    )


def quantize(x: np.ndarray, quant: tuple[float, int], dtype: np.dtype[Any]) -> np.ndarray:
    info = np.iinfo(dtype)
    q: np.ndarray = np.divide(x, quant[0], dtype=np.float32)
    q += quant[1]
    np.rint(q, out=q)
    np.clip(q, info.min, info.max, out=q)
    out: np.ndarray = q.astype(dtype)
    return out


def dequantize(y: np.ndarray, quant: tuple[float, int]) -> np.ndarray:
    """A quantized output as float32, ``(y - zero_point) * scale``, in one new array."""
    out: np.ndarray = np.subtract(y, quant[1], dtype=np.float32)
    out *= np.float32(quant[0])
    return out


def quantization_of(interp: Any, inputs: list[Any], outputs: list[Any]) -> str:
    try:
        # Op details are private API; without them the activation test uses the model's I/O only.
        ops = interp._get_ops_details()
    except Exception:
        ops = None
    return tflite_quantization(interp.get_tensor_details(), inputs, outputs, ops)


def error_text(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def import_interpreter() -> tuple[Any, str]:
    try:
        from ai_edge_litert import interpreter
    except ImportError as exc:
        if exc.name != "ai_edge_litert":
            raise BackendUnavailableError(f"ai-edge-litert failed to import: {exc}") from exc
    else:
        return interpreter, "ai_edge_litert"
    try:
        from tflite_runtime import interpreter as legacy
    except ImportError:
        raise BackendUnavailableError(
            "TFLite models need LiteRT: pip install ai-edge-litert"
        ) from None
    return legacy, "tflite_runtime"


def check_header(spec: SessionSpec) -> None:
    try:
        size = spec.path.stat().st_size
        with open(spec.path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise ModelNotFoundError(f"model file {spec.path} does not exist") from None
    except OSError as exc:
        raise ModelNotFoundError(f"cannot read model file {spec.path}: {exc}") from exc
    if len(head) < 8 or head[4:8] != b"TFL3":
        raise ModelFormatError(f"{spec.path} is not a TFLite model (no TFL3 identifier)")
    root = int.from_bytes(head[:4], "little")
    if not 8 <= root <= size - 4:
        raise ModelFormatError(
            f"{spec.path} is truncated or corrupt: its root table offset {root} lies outside the "
            f"{size}-byte file"
        )


def check_input_shape(details: Mapping[str, Any], name: str, shape: Sequence[int]) -> None:
    if name not in details:
        raise ConfigError(f"input_shapes names {name!r}; the model's inputs are {sorted(details)}")
    sig = details[name]["shape_signature"]
    if len(sig) != len(shape) or any(s >= 0 and s != n for s, n in zip(sig, shape)):
        raise ConfigError(
            f"input_shapes[{name!r}] = {tuple(shape)} does not fit the model's shape "
            f"{[None if s < 0 else int(s) for s in sig]}"
        )


def model_error(spec: SessionSpec, exc: Exception) -> Exception:
    text = error_text(exc)
    if any(k in text for k in ("Flatbuffer", "allocation is null", "identifier", "mmap")):
        return ModelFormatError(f"{spec.path} is not a valid TFLite model: {text}")
    return ModelLoadError(f"LiteRT refused {spec.path}: {text}")
