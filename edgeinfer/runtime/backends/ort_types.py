"""onnxruntime's type strings as edgeinfer dtypes, and onnxruntime's errors as edgeinfer's.

``TensorSpec.dtype`` is a numpy dtype name where numpy has the type (``float32``, ``uint64``...),
``"str"`` for ``tensor(string)`` (fed as a numpy object array, or a ``np.str_`` array), the
``ml_dtypes`` name for the types numpy lacks (``bfloat16``, ``float8_e4m3fn``, ``int4``...), and
onnxruntime's own string for inputs that are no tensor (``seq(tensor(float))``,
``optional(...)``, ``map(...)``): those are passed to onnxruntime as given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import InferenceError, ModelLoadError, ModelMemoryError
from ..base import TensorSpec

ORT_TYPES = {
    "tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
    "tensor(int8)": "int8", "tensor(uint8)": "uint8", "tensor(int16)": "int16",
    "tensor(uint16)": "uint16", "tensor(int32)": "int32", "tensor(uint32)": "uint32",
    "tensor(int64)": "int64", "tensor(uint64)": "uint64", "tensor(bool)": "bool",
    "tensor(string)": "str",
    # numpy has none of these; ml_dtypes (installed with onnx) names them so
    "tensor(bfloat16)": "bfloat16", "tensor(float8e4m3fn)": "float8_e4m3fn",
    "tensor(float8e4m3fnuz)": "float8_e4m3fnuz", "tensor(float8e5m2)": "float8_e5m2",
    "tensor(float8e5m2fnuz)": "float8_e5m2fnuz", "tensor(int4)": "int4", "tensor(uint4)": "uint4",
    "tensor(float4e2m1)": "float4_e2m1fn",
}


def dtype_of(ort_type: str) -> str:
    """The edgeinfer dtype name for an onnxruntime type string (unknown ones kept as they are)."""
    return ORT_TYPES.get(ort_type, ort_type)


def spec_of(arg: Any, fixed: Mapping[str, tuple[int, ...]]) -> TensorSpec:
    """A ``TensorSpec`` from onnxruntime's ``NodeArg``; a negative or unnamed dim is dynamic."""
    shape = tuple(
        d if isinstance(d, int) and d >= 0 else (d if isinstance(d, str) and d else None)
        for d in (arg.shape or ())
    )
    if arg.name in fixed:
        shape = tuple(fixed[arg.name])
    return TensorSpec(arg.name, shape, dtype_of(arg.type))


def short(exc: Exception, limit: int = 300) -> str:
    """onnxruntime's messages carry source paths and repeat themselves; keep the useful head."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = text.replace("[ONNXRuntimeError] : ", "")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_oom(text: str) -> bool:
    low = text.lower()
    return "alloc" in low and ("fail" in low or "memory" in low)


def load_error(exc: Exception, model_name: str) -> Exception:
    text = short(exc)
    if _is_oom(text):
        return ModelMemoryError(f"{model_name}: out of memory while loading: {text}")
    return ModelLoadError(f"onnxruntime could not load {model_name}: {text}")


def run_error(exc: Exception) -> Exception:
    text = short(exc)
    if _is_oom(text):
        return ModelMemoryError(f"out of memory while running: {text}")
    return InferenceError(f"onnxruntime failed to run the model: {text}")
