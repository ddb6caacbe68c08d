"""Tiny TFLite models built in code with the flatbuffers object API (no TensorFlow needed).

Each builder writes ``path`` and returns it; each has a numpy reference next to it. Only
``ai_edge_litert`` (for the generated schema), ``flatbuffers`` and ``numpy`` are needed, so the
aarch64 emulation subset can use them too.

Quantized tensors follow the TFLite convention ``real = (q - zero_point) * scale``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

__all__ = [
    "FC_BIAS",
    "FC_WEIGHTS",
    "INT8_FC_INPUT",
    "INT8_FC_OUTPUT",
    "INT8_FC_WEIGHTS",
    "UINT8_ADD_C",
    "UINT8_ADD_IN",
    "UINT8_ADD_OUT",
    "add_model",
    "add_model_bytes",
    "add_reference",
    "dequantize",
    "dynamic_range_fc_model",
    "float16_fc_model",
    "fully_connected_model",
    "fully_connected_reference",
    "int8_fc_model",
    "int8_fc_reference",
    "quantize",
    "reshape_model",
    "ssd_postprocess_model",
    "uint8_add_model",
    "uint8_add_reference",
]

TT = schema.TensorType
OP = schema.BuiltinOperator

# Known weights for the fully-connected models: 4 inputs -> 3 outputs, TFLite layout [out, in].
FC_WEIGHTS = np.array(
    [[0.5, -1.0, 0.25, 2.0], [1.5, 0.0, -0.5, 1.0], [-2.0, 0.75, 1.0, -0.25]], dtype=np.float32
)
FC_BIAS = np.array([0.1, -0.2, 0.3], dtype=np.float32)


# (scale, zero_point) of the int8 fully-connected model. The weights are exact in their scale and
# the input step is small, so for float input in [-1, 1] the model's dequantized output is within
# one output step of ``fully_connected_reference`` computed in plain float.
INT8_FC_INPUT = (0.01, -3)
INT8_FC_WEIGHTS = (0.0625, 0)
INT8_FC_OUTPUT = (0.1, 5)


def quantize(x: np.ndarray, scale: float, zero_point: int, dtype: Any = np.int8) -> np.ndarray:
    """``round(x / scale + zero_point)`` clipped to ``dtype``'s range."""
    info = np.iinfo(dtype)
    q = np.round(np.asarray(x, dtype=np.float64) / scale + zero_point)
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """``(q - zero_point) * scale`` as float32."""
    return ((q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)).astype(np.float32)


# --- building blocks ---------------------------------------------------------------------------


def _quant(scale: float, zero_point: int) -> schema.QuantizationParametersT:
    q = schema.QuantizationParametersT()
    q.scale = [float(scale)]
    q.zeroPoint = [int(zero_point)]
    return q


class _Graph:
    """Collects buffers, tensors and operators of one subgraph."""

    def __init__(self) -> None:
        empty = schema.BufferT()  # buffer 0 is the conventional "no data" buffer
        self.buffers: list[schema.BufferT] = [empty]
        self.tensors: list[schema.TensorT] = []
        self.operators: list[schema.OperatorT] = []
        self.opcodes: list[schema.OperatorCodeT] = []

    def tensor(
        self,
        name: str,
        shape: Sequence[int],
        ttype: int,
        *,
        data: np.ndarray | None = None,
        quant: tuple[float, int] | None = None,
        signature: Sequence[int] | None = None,
    ) -> int:
        t = schema.TensorT()
        t.name = name
        t.shape = list(shape)
        t.type = ttype
        if signature is not None:
            t.shapeSignature = list(signature)
        if quant is not None:
            t.quantization = _quant(*quant)
        if data is not None:
            buf = schema.BufferT()
            buf.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)
            self.buffers.append(buf)
            t.buffer = len(self.buffers) - 1
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(
        self,
        code: int,
        inputs: Sequence[int],
        outputs: Sequence[int],
        *,
        options: Any = None,
        options_type: int = 0,
        version: int = 1,
    ) -> None:
        index = next(
            (
                i
                for i, c in enumerate(self.opcodes)
                if c.builtinCode == code and c.version == version
            ),
            None,
        )
        if index is None:
            oc = schema.OperatorCodeT()
            oc.builtinCode = code
            # Codes below 127 must also be in the deprecated field or old readers see op 0 (ADD).
            oc.deprecatedBuiltinCode = min(code, 127)
            oc.version = version
            self.opcodes.append(oc)
            index = len(self.opcodes) - 1
        o = schema.OperatorT()
        o.opcodeIndex = index
        o.inputs = list(inputs)
        o.outputs = list(outputs)
        o.builtinOptionsType = options_type
        o.builtinOptions = options
        self.operators.append(o)

    def finish(self, inputs: Sequence[int], outputs: Sequence[int]) -> bytes:
        sg = schema.SubGraphT()
        sg.tensors = self.tensors
        sg.inputs = list(inputs)
        sg.outputs = list(outputs)
        sg.operators = self.operators
        sg.name = "main"
        model = schema.ModelT()
        model.version = 3
        model.description = "edgeinfer.testing.tflite_models"
        model.operatorCodes = self.opcodes
        model.subgraphs = [sg]
        model.buffers = self.buffers
        builder = flatbuffers.Builder(1024)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def _write(path: Path, data: bytes) -> Path:
    path = Path(path)
    path.write_bytes(data)
    return path


def _fc_options() -> schema.FullyConnectedOptionsT:
    return schema.FullyConnectedOptionsT()


# --- float models ------------------------------------------------------------------------------


def add_model(
    path: Path, shape: Sequence[int] = (1, 4), *, dynamic_batch: bool = False, name: str = "x"
) -> Path:
    """``y = x + c`` in float32 with ``c = [1, 2, ..., shape[-1]]`` broadcast over the last axis.

    With ``dynamic_batch`` the first dimension's signature is -1 (resizable at run time).
    """
    return _write(path, add_model_bytes(shape, dynamic_batch=dynamic_batch, name=name))


def add_model_bytes(
    shape: Sequence[int] = (1, 4), *, dynamic_batch: bool = False, name: str = "x"
) -> bytes:
    """The bytes of :func:`add_model` (for corruption tests that mutate them)."""
    g = _Graph()
    sig = [-1, *shape[1:]] if dynamic_batch else None
    x = g.tensor(name, shape, TT.FLOAT32, signature=sig)
    c = g.tensor("c", [shape[-1]], TT.FLOAT32, data=_add_constant(shape[-1]))
    y = g.tensor("y", shape, TT.FLOAT32, signature=sig)
    g.op(
        OP.ADD,
        [x, c],
        [y],
        options=schema.AddOptionsT(),
        options_type=schema.BuiltinOptions.AddOptions,
    )
    return g.finish([x], [y])


def _add_constant(n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.float32)


def add_reference(x: np.ndarray) -> np.ndarray:
    """numpy reference of :func:`add_model`."""
    y: np.ndarray = (x + _add_constant(x.shape[-1])).astype(np.float32)
    return y


def fully_connected_model(path: Path, batch: int = 1) -> Path:
    """``y = x @ FC_WEIGHTS.T + FC_BIAS``: float32 ``x`` [batch, 4] -> ``y`` [batch, 3]."""
    g = _Graph()
    x = g.tensor("x", [batch, 4], TT.FLOAT32)
    w = g.tensor("weights", [3, 4], TT.FLOAT32, data=FC_WEIGHTS)
    b = g.tensor("bias", [3], TT.FLOAT32, data=FC_BIAS)
    y = g.tensor("y", [batch, 3], TT.FLOAT32)
    g.op(
        OP.FULLY_CONNECTED,
        [x, w, b],
        [y],
        options=_fc_options(),
        options_type=schema.BuiltinOptions.FullyConnectedOptions,
    )
    return _write(path, g.finish([x], [y]))


def fully_connected_reference(x: np.ndarray, weights: np.ndarray = FC_WEIGHTS) -> np.ndarray:
    """numpy reference of :func:`fully_connected_model` (and its float16/dynamic variants)."""
    y: np.ndarray = (x.astype(np.float32) @ weights.T + FC_BIAS).astype(np.float32)
    return y


def float16_fc_model(path: Path) -> Path:
    """:func:`fully_connected_model` with float16 weights dequantized by a DEQUANTIZE op."""
    g = _Graph()
    x = g.tensor("x", [1, 4], TT.FLOAT32)
    w16 = g.tensor("weights_fp16", [3, 4], TT.FLOAT16, data=FC_WEIGHTS.astype(np.float16))
    w = g.tensor("weights", [3, 4], TT.FLOAT32)
    b = g.tensor("bias", [3], TT.FLOAT32, data=FC_BIAS)
    y = g.tensor("y", [1, 3], TT.FLOAT32)
    g.op(OP.DEQUANTIZE, [w16], [w], version=3)
    g.op(
        OP.FULLY_CONNECTED,
        [x, w, b],
        [y],
        options=_fc_options(),
        options_type=schema.BuiltinOptions.FullyConnectedOptions,
    )
    return _write(path, g.finish([x], [y]))


def dynamic_range_fc_model(path: Path) -> Path:
    """Dynamic-range (hybrid) FC: float32 activations, int8 symmetric weights, float32 bias."""
    scale = float(np.abs(FC_WEIGHTS).max() / 127.0)
    g = _Graph()
    x = g.tensor("x", [1, 4], TT.FLOAT32)
    w = g.tensor("weights", [3, 4], TT.INT8, data=quantize(FC_WEIGHTS, scale, 0), quant=(scale, 0))
    b = g.tensor("bias", [3], TT.FLOAT32, data=FC_BIAS)
    y = g.tensor("y", [1, 3], TT.FLOAT32)
    g.op(
        OP.FULLY_CONNECTED,
        [x, w, b],
        [y],
        options=_fc_options(),
        options_type=schema.BuiltinOptions.FullyConnectedOptions,
        version=3,
    )
    return _write(path, g.finish([x], [y]))


# --- fully quantized models --------------------------------------------------------------------


def _int8_fc_weights() -> tuple[np.ndarray, np.ndarray]:
    s_in, _ = INT8_FC_INPUT
    s_w, _ = INT8_FC_WEIGHTS
    w_q = quantize(FC_WEIGHTS, s_w, 0)
    b_q = np.round(FC_BIAS / (s_in * s_w)).astype(np.int32)
    return w_q, b_q


def int8_fc_model(path: Path) -> Path:
    """Fully int8 FC: int8 ``x`` [1, 4] -> int8 ``y`` [1, 3]; int8 weights, int32 bias.

    Scales and zero points are in ``INT8_FC_*``; the float weights are :data:`FC_WEIGHTS`.
    """
    s_in, _ = INT8_FC_INPUT
    s_w, _ = INT8_FC_WEIGHTS
    w_q, b_q = _int8_fc_weights()
    g = _Graph()
    x = g.tensor("x", [1, 4], TT.INT8, quant=INT8_FC_INPUT)
    w = g.tensor("weights", [3, 4], TT.INT8, data=w_q, quant=(s_w, 0))
    b = g.tensor("bias", [3], TT.INT32, data=b_q, quant=(s_in * s_w, 0))
    y = g.tensor("y", [1, 3], TT.INT8, quant=INT8_FC_OUTPUT)
    g.op(
        OP.FULLY_CONNECTED,
        [x, w, b],
        [y],
        options=_fc_options(),
        options_type=schema.BuiltinOptions.FullyConnectedOptions,
        version=4,
    )
    return _write(path, g.finish([x], [y]))


def int8_fc_reference(x_q: np.ndarray) -> np.ndarray:
    """Float output of :func:`int8_fc_model` for int8 input ``x_q``, before output rounding.

    Computed in float64 from the quantized weights and bias, so the model's int8 output
    dequantized must be within one output step (``INT8_FC_OUTPUT[0]``) of this (or clipped).
    """
    s_in, zp_in = INT8_FC_INPUT
    s_w, _ = INT8_FC_WEIGHTS
    w_q, b_q = _int8_fc_weights()
    acc = (x_q.astype(np.int64) - zp_in) @ w_q.astype(np.int64).T + b_q
    y: np.ndarray = (acc * (s_in * s_w)).astype(np.float32)
    return y


# ADD of two uint8 tensors, one of them constant: y = x + c, all asymmetric uint8.
UINT8_ADD_IN = (0.02, 128)
UINT8_ADD_C = (0.01, 0)
UINT8_ADD_OUT = (0.04, 100)
_UINT8_C = np.array([0, 50, 100, 255], dtype=np.uint8)


def uint8_add_model(path: Path) -> Path:
    """Quantized uint8 ``y = x + c`` on [1, 4]; parameters in ``UINT8_ADD_*``."""
    g = _Graph()
    x = g.tensor("x", [1, 4], TT.UINT8, quant=UINT8_ADD_IN)
    c = g.tensor("c", [1, 4], TT.UINT8, data=_UINT8_C, quant=UINT8_ADD_C)
    y = g.tensor("y", [1, 4], TT.UINT8, quant=UINT8_ADD_OUT)
    g.op(
        OP.ADD,
        [x, c],
        [y],
        options=schema.AddOptionsT(),
        options_type=schema.BuiltinOptions.AddOptions,
    )
    return _write(path, g.finish([x], [y]))


def uint8_add_reference(x_q: np.ndarray) -> np.ndarray:
    """Float output of :func:`uint8_add_model` for uint8 input ``x_q``, before output rounding."""
    y: np.ndarray = dequantize(x_q, *UINT8_ADD_IN) + dequantize(_UINT8_C, *UINT8_ADD_C)
    return y


def reshape_model(path: Path) -> Path:
    """``y = reshape(x, [8])`` with ``x`` declared [2, 4] and signature [-1, 4].

    Only a batch of 2 fits, so a warm-up that guesses the dynamic batch as 1 fails.
    """
    g = _Graph()
    x = g.tensor("x", [2, 4], TT.FLOAT32, signature=[-1, 4])
    shape = g.tensor("new_shape", [1], TT.INT32, data=np.array([8], dtype=np.int32))
    y = g.tensor("y", [8], TT.FLOAT32)
    g.op(OP.RESHAPE, [x, shape], [y])
    return _write(path, g.finish([x], [y]))


def ssd_postprocess_model(
    path: Path,
    outputs: Sequence[tuple[str, np.ndarray, tuple[float, int] | None]],
    size: tuple[int, int] = (300, 300),
) -> Path:
    """A stand-in for a quantized SSD export: a uint8 ``[1, h, w, 3]`` image in, and
    ``outputs`` (name, values, int8 quantization or ``None`` for float32) out in that order,
    each ``values + 0`` (an ADD of constants: the image is not read).

    Quantized values are given as float and stored as int8 with their (scale, zero point).
    """
    w, h = size
    g = _Graph()
    image = g.tensor("images", [1, h, w, 3], TT.UINT8, quant=(1.0, 0))
    outs = []
    for name, values, quant in outputs:
        shape = list(values.shape)
        if quant is None:
            data, ttype = values.astype(np.float32), TT.FLOAT32
        else:
            data, ttype = quantize(values, *quant), TT.INT8
        zero = np.full(shape, 0 if quant is None else quant[1], data.dtype)
        a = g.tensor(name + "_value", shape, ttype, data=data, quant=quant)
        b = g.tensor(name + "_zero", shape, ttype, data=zero, quant=quant)
        y = g.tensor(name, shape, ttype, quant=quant)
        g.op(OP.ADD, [a, b], [y], options=schema.AddOptionsT(),
             options_type=schema.BuiltinOptions.AddOptions, version=2 if quant else 1)
        outs.append(y)
    return _write(path, g.finish([image], outs))
