"""Inspect a model file before any runtime sees it: format, hash, size, graph facts, safety.

The format comes from the bytes (a TFLite flatbuffer carries ``TFL3`` at offset 4; an ONNX model
is a protobuf ``ModelProto``), never from the file name. ONNX files are read with a small
protobuf wire-format walker over an ``mmap``: it needs no ``onnx`` package on the device, skips
weight bytes without copying them, and turns a truncated or corrupt file into a clear
``ModelFormatError`` before onnxruntime is asked to parse it.
"""

from __future__ import annotations

import hashlib
import mmap
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError, ModelNotFoundError, ModelTooLargeError, UnsafeModelError
from .digest import cached_digest

_MiB = 1024 * 1024

# ONNX TensorProto.DataType values that matter for classification.
_UINT8, _INT8, _FLOAT16 = 2, 3, 10
_DTYPE_NAMES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16",
                11: "float64", 16: "bfloat16", 21: "uint4", 22: "int4"}

_QOPERATOR_OPS = frozenset({
    "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
    "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool", "QLinearConcat",
    "QLinearSoftmax", "QLinearReduceMean", "QLinearWhere", "QGemm", "QAttention",
})
_DYNAMIC_OPS = frozenset({
    "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger", "DynamicQuantizeMatMul",
    "DynamicQuantizeLSTM", "MatMulIntegerToFloat",
})


@dataclass(slots=True)
class OnnxGraphInfo:
    """Facts read from an ONNX ``ModelProto`` without loading it."""

    ir_version: int = 0
    producer: str = ""
    opsets: dict[str, int] = field(default_factory=dict)
    op_counts: Counter[str] = field(default_factory=Counter)
    initializer_types: Counter[str] = field(default_factory=Counter)
    external_data: set[str] = field(default_factory=set)
    metadata: dict[str, str] = field(default_factory=dict)
    activation_type: str | None = None  # "uint8" / "int8" of QuantizeLinear zero points
    weight_type: str | None = None  # "int8" / "uint8" of DequantizeLinear'd initializers
    inputs: dict[str, tuple[int | str | None, ...]] = field(default_factory=dict)

    @property
    def quantization(self) -> str:
        """``int8-qoperator``, ``int8-qdq``, ``int8-dynamic``, ``float16`` or ``float``."""
        ops = self.op_counts
        if any(op in ops for op in _QOPERATOR_OPS):
            return "int8-qoperator"
        if ops.get("QuantizeLinear") and ops.get("DequantizeLinear"):
            return "int8-qdq"
        if any(op in ops for op in _DYNAMIC_OPS):
            return "int8-dynamic"
        if ops.get("DequantizeLinear") and self.weight_type in ("int8", "uint8"):
            return "int8-weights"  # weight-only quantization: int8 storage, float compute
        if self.initializer_types.get("float16", 0) > self.initializer_types.get("float32", 0):
            return "float16"
        return "float"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ir_version": self.ir_version,
            "producer": self.producer,
            "opsets": dict(self.opsets),
            "nodes": sum(self.op_counts.values()),
            "op_types": dict(sorted(self.op_counts.items())),
            "quantization": self.quantization,
            "activation_type": self.activation_type,
            "weight_type": self.weight_type,
            "external_data": sorted(self.external_data),
            "metadata": dict(self.metadata),
        }


@dataclass(slots=True)
class ModelFileInfo:
    """What ``inspect_model`` found: the file's format, identity, size and (ONNX) graph."""

    path: Path
    format: str
    sha256: str
    size_bytes: int
    onnx: OnnxGraphInfo | None = None

    @property
    def size_mb(self) -> float:
        return self.size_bytes / _MiB


def detect_format(head: bytes) -> str:
    """``"tflite"`` or ``"onnx"`` from a file's first bytes; ``ModelFormatError`` otherwise."""
    if len(head) >= 8 and head[4:8] == b"TFL3":
        return "tflite"
    if head and all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        # A real ModelProto has a binary varint right after its first tag; text never is one.
        raise ModelFormatError(f"not an ONNX or TFLite model: {_describe_foreign(head)}")
    # A ModelProto starts with one of its field tags: ir_version (0x08), producer_name (0x12),
    # producer_version (0x1a), domain (0x22), model_version (0x28), doc_string (0x32),
    # graph (0x3a), opset_import (0x42), metadata_props (0x72).
    if head[:1] in (b"\x08", b"\x12", b"\x1a", b"\x22", b"\x28", b"\x32", b"\x3a", b"\x42", b"\x72"):
        return "onnx"
    raise ModelFormatError(f"not an ONNX or TFLite model: {_describe_foreign(head)}")


def _describe_foreign(head: bytes) -> str:
    if not head:
        return "the file is empty"
    if head.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer, not the model (run `git lfs pull`)"
    if head.startswith(b"PK\x03\x04"):
        return "it is a zip archive (a PyTorch checkpoint or a wheel?)"
    if head.startswith(b"\x89HDF"):
        return "it is an HDF5 file (a Keras .h5 model; convert it to TFLite or ONNX)"
    if head.lstrip()[:1] in (b"<", b"{"):
        return "it is an HTML/XML/JSON text file (a failed download?)"
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return "it is a text file"
    return f"unrecognised header {head[:8].hex()}"


def inspect_model(path: Path, *, max_model_mb: float | None = None,
                  digest: bool = True) -> ModelFileInfo:
    """Check that ``path`` is a readable, safe model within the size limit and describe it.

    Raises:
        ModelNotFoundError: no such file, a directory, or unreadable.
        ModelTooLargeError: the file (with its external data) exceeds ``max_model_mb``.
        ModelFormatError: neither ONNX nor TFLite, or truncated/corrupt ONNX.
        UnsafeModelError: ONNX external data that points outside the model's folder.
    """
    path = Path(path)
    try:
        st = path.stat()
        size = st.st_size
        if not path.is_file():
            raise ModelNotFoundError(f"model path {path} is not a file")
        f = open(path, "rb")  # noqa: SIM115 (closed by the `with f:` below, after the errors are mapped)
    except FileNotFoundError:
        raise ModelNotFoundError(f"model file not found: {path}") from None
    except PermissionError:
        raise ModelNotFoundError(f"model file not readable (permission denied): {path}") from None
    with f:
        _check_size(path, size, max_model_mb)
        try:
            fmt = detect_format(f.read(64))
        except ModelFormatError as exc:
            raise ModelFormatError(f"{path}: {exc}") from None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            # ``digest=False``: a caller that only reads the graph skips hashing the weights
            # and a file version already hashed in this process is not hashed again
            sha = cached_digest(path, st, lambda: hashlib.sha256(mm).hexdigest()) if digest else ""
            graph = None
            if fmt == "onnx":
                view = memoryview(mm)
                try:
                    graph = scan_onnx(view, path)
                finally:
                    view.release()  # else a raised error's frames keep the mmap exported
    info = ModelFileInfo(path=path, format=fmt, sha256=sha, size_bytes=size, onnx=graph)
    if graph is not None and graph.external_data:
        info.size_bytes += _check_external_data(path, graph.external_data)
        _check_size(path, info.size_bytes, max_model_mb)
    return info


def _check_size(path: Path, size: int, max_model_mb: float | None) -> None:
    if max_model_mb is not None and size > max_model_mb * _MiB:
        raise ModelTooLargeError(
            f"{path} is {size / _MiB:.1f} MiB, over max_model_mb={max_model_mb:g}"
        )


def _check_external_data(path: Path, locations: set[str]) -> int:
    """Every external-data file must sit inside the model's folder; returns their total size."""
    folder = path.parent.resolve()
    total = 0
    for loc in sorted(locations):
        rel = Path(loc)
        target = (folder / rel).resolve()
        if rel.is_absolute() or ".." in rel.parts or not target.is_relative_to(folder):
            raise UnsafeModelError(
                f"{path}: external data {loc!r} points outside the model's folder {folder}"
            )
        try:
            total += target.stat().st_size
        except FileNotFoundError:
            raise ModelFormatError(f"{path}: external data file {loc!r} is missing") from None
    return total


# --- protobuf wire format --------------------------------------------------------------------


class _Corrupt(Exception):
    pass


class _TooDeep(Exception):
    pass


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Corrupt
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: memoryview, start: int, end: int):  # type: ignore[no-untyped-def]
    """Yield ``(field_number, wire_type, value)``; for length-delimited fields ``value`` is the
    ``(start, end)`` span, for varints the integer, for fixed-width fields ``None``."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise _Corrupt
        if wt == 0:
            value, pos = _varint(buf, pos, end)
            yield num, wt, value
        elif wt == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise _Corrupt
            yield num, wt, (pos, pos + n)
            pos += n
        elif wt == 1 or wt == 5:
            pos += 8 if wt == 1 else 4
            if pos > end:
                raise _Corrupt
            yield num, wt, None
        else:  # groups (3, 4) are not used by ONNX; anything else is garbage
            raise _Corrupt


def _str(buf: memoryview, span: tuple[int, int]) -> str:
    return bytes(buf[span[0] : span[1]]).decode("utf-8", "replace")


def scan_onnx(buf: memoryview, path: Path) -> OnnxGraphInfo:
    info = OnnxGraphInfo()
    init_types: dict[str, int] = {}
    q_zero_points: list[str] = []
    dq_inputs: list[str] = []
    seen_graph = False
    try:
        for num, wt, val in _fields(buf, 0, len(buf)):
            if num == 1 and wt == 0:
                info.ir_version = val
            elif num == 2 and wt == 2:
                info.producer = _str(buf, val)
            elif num == 7 and wt == 2:
                seen_graph = True
                _scan_graph(buf, val, info, init_types, q_zero_points, dq_inputs, top=True)
            elif num == 8 and wt == 2:
                domain, version = "", 0
                for n2, w2, v2 in _fields(buf, *val):
                    if n2 == 1 and w2 == 2:
                        domain = _str(buf, v2)
                    elif n2 == 2 and w2 == 0:
                        version = v2
                info.opsets[domain or "ai.onnx"] = version
            elif num == 14 and wt == 2:
                key, value = _string_entry(buf, val)
                info.metadata[key] = value
    except _Corrupt:
        raise ModelFormatError(
            f"{path}: truncated or corrupt ONNX file (the protobuf structure is broken)"
        ) from None
    except _TooDeep:
        raise ModelFormatError(
            f"{path}: subgraphs (If/Loop/Scan) nested deeper than {_MAX_SUBGRAPH_DEPTH} levels"
        ) from None
    if not seen_graph or info.ir_version == 0:
        raise ModelFormatError(f"{path}: not an ONNX model (no graph or no IR version)")
    for name in init_types:  # IR < 4 lists initializers among the inputs; they are not fed
        info.inputs.pop(name, None)
    info.activation_type = _common_type(q_zero_points, init_types)
    info.weight_type = _common_type(dq_inputs, init_types, only=(_INT8, _UINT8))
    return info


def _string_entry(buf: memoryview, span: tuple[int, int]) -> tuple[str, str]:
    key = value = ""
    for n, w, v in _fields(buf, *span):
        if n == 1 and w == 2:
            key = _str(buf, v)
        elif n == 2 and w == 2:
            value = _str(buf, v)
    return key, value


# Subgraphs (If/Loop/Scan bodies) nest; a real model nests a few levels, a hostile one thousands
# (2,000 nested If made this scan, and onnx's own checker, die of RecursionError).
_MAX_SUBGRAPH_DEPTH = 64


def _scan_graph(buf: memoryview, span: tuple[int, int], info: OnnxGraphInfo,
                init_types: dict[str, int], q_zero_points: list[str], dq_inputs: list[str],
                top: bool = False, depth: int = 0) -> None:
    if depth > _MAX_SUBGRAPH_DEPTH:
        raise _TooDeep
    for num, wt, val in _fields(buf, *span):
        if wt != 2:
            continue
        if num == 1:  # NodeProto
            _scan_node(buf, val, info, init_types, q_zero_points, dq_inputs, depth)
        elif num == 11 and top:  # the main graph's inputs (subgraph inputs are internal)
            name, dims = _scan_value_info(buf, val)
            info.inputs[name] = dims
        elif num == 5:  # TensorProto initializer
            name, dtype, location = _scan_tensor(buf, val)
            init_types[name] = dtype
            info.initializer_types[_DTYPE_NAMES.get(dtype, str(dtype))] += 1
            if location:
                info.external_data.add(location)


def _scan_node(buf: memoryview, span: tuple[int, int], info: OnnxGraphInfo,
               init_types: dict[str, int], q_zero_points: list[str], dq_inputs: list[str],
               depth: int) -> None:
    inputs: list[str] = []
    op = ""
    for num, wt, val in _fields(buf, *span):
        if wt != 2:
            continue
        if num == 1:
            inputs.append(_str(buf, val))
        elif num == 4:
            op = _str(buf, val)
        elif num == 5:  # AttributeProto: subgraphs of If/Loop/Scan hold nodes too
            for n2, w2, v2 in _fields(buf, *val):
                if w2 == 2 and n2 in (6, 11):  # g, graphs
                    _scan_graph(buf, v2, info, init_types, q_zero_points, dq_inputs,
                                depth=depth + 1)
    info.op_counts[op] += 1
    if op == "QuantizeLinear" and len(inputs) >= 3:
        q_zero_points.append(inputs[2])
    elif op == "DequantizeLinear" and inputs:
        dq_inputs.append(inputs[0])


def _scan_value_info(buf: memoryview, span: tuple[int, int]) -> tuple[str, tuple[int | str | None, ...]]:
    """ValueInfoProto -> (name, dims); a dim is its value, its symbolic name, or None."""
    name = ""
    dims: list[int | str | None] = []
    for num, wt, val in _fields(buf, *span):
        if num == 1 and wt == 2:
            name = _str(buf, val)
        elif num == 2 and wt == 2:  # TypeProto -> tensor_type (1) -> shape (2) -> dim (1)
            for n2, w2, v2 in _fields(buf, *val):
                if n2 != 1 or w2 != 2:
                    continue
                for n3, w3, v3 in _fields(buf, *v2):
                    if n3 != 2 or w3 != 2:
                        continue
                    for n4, w4, v4 in _fields(buf, *v3):
                        if n4 == 1 and w4 == 2:
                            dims.append(_scan_dim(buf, v4))
    return name, tuple(dims)


def _scan_dim(buf: memoryview, span: tuple[int, int]) -> int | str | None:
    for num, wt, val in _fields(buf, *span):
        if num == 1 and wt == 0:
            # an int64 on the wire: ``dim_value: -1`` (Paddle2ONNX's dynamic dimension) arrives
            # as 2**64 - 1. Any negative value is a dynamic dimension, as onnxruntime reads it.
            value = int(val) - (1 << 64) if val >= 1 << 63 else int(val)
            return value if value >= 0 else None
        if num == 2 and wt == 2:
            return _str(buf, val) or None
    return None


def _scan_tensor(buf: memoryview, span: tuple[int, int]) -> tuple[str, int, str]:
    name, dtype, location = "", 0, ""
    for num, wt, val in _fields(buf, *span):
        if num == 2 and wt == 0:
            dtype = val
        elif num == 8 and wt == 2:
            name = _str(buf, val)
        elif num == 13 and wt == 2:
            key, value = _string_entry(buf, val)
            if key == "location":
                location = value
    return name, dtype, location


def _common_type(names: list[str], types: dict[str, int], only: tuple[int, ...] = ()) -> str | None:
    found = Counter(types[n] for n in names if n in types and (not only or types[n] in only))
    if not found:
        return None
    return _DTYPE_NAMES.get(found.most_common(1)[0][0], "other")


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_MiB):
            h.update(chunk)
    return h.hexdigest()


__all__ = ["ModelFileInfo", "OnnxGraphInfo", "detect_format", "file_sha256", "inspect_model",
           "scan_onnx"]
