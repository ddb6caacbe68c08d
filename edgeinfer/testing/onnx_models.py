"""Tiny ONNX models built with ``onnx.helper``: one per quantization style, plus bad ones.

Each builder writes ``path`` and returns it. The numbers are chosen so that a numpy reference
is easy to write in a test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph: onnx.GraphProto, path: Path, opset: int = OPSET, **kw: object) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path), **kw)  # type: ignore[arg-type]
    return path


def add_model(path: Path, shape: tuple[int | str, ...] = (1, 4), name: str = "x") -> Path:
    """``y = x + 1`` in float32; input ``x`` (or ``name``), output ``y``."""
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", [name, "one"], ["y"])],
        "add",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializer=[one],
    )
    return _save(graph, path)


def two_input_model(path: Path) -> Path:
    """``sum = a + b`` (float32 [1, 3]) and ``scaled = b * k`` (int64 scalar k as float)."""
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["b", "kf"], ["scaled"]),
        ],
        "two",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("k", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, [1, 3]),
            helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [1, 3]),
        ],
    )
    return _save(graph, path)


def matmul_weights(k: int = 8, n: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(k, n)).astype(np.float32)


def matmul_model(path: Path, k: int = 8, n: int = 4, batch: int | str = 1) -> Path:
    """``y = x @ W`` in float32 with ``W = matmul_weights(k, n)``."""
    w = numpy_helper.from_array(matmul_weights(k, n), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n])],
        initializer=[w],
    )
    return _save(graph, path)


def qdq_matmul_model(
    path: Path, k: int = 8, n: int = 4, signed_activations: bool = True
) -> Path:
    """INT8 QDQ: ``x -> Q/DQ -> MatMul(DQ(W_int8)) -> y``, the layout static quantization emits.

    Activations are S8 (``signed_activations``) or U8; weights are always S8, per tensor.
    Scales: x 1/64, W 1/127.
    """
    w = matmul_weights(k, n)
    w_scale = np.float32(1 / 127)
    w_q = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
    x_scale = np.float32(1 / 64)
    act_type = np.int8 if signed_activations else np.uint8
    x_zp = np.array(0 if signed_activations else 128, dtype=act_type)
    inits = [
        numpy_helper.from_array(w_q, "W_q"),
        numpy_helper.from_array(np.array(w_scale), "W_scale"),
        numpy_helper.from_array(np.array(0, dtype=np.int8), "W_zp"),
        numpy_helper.from_array(np.array(x_scale), "x_scale"),
        numpy_helper.from_array(x_zp, "x_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["W_q", "W_scale", "W_zp"], ["W_dq"]),
        helper.make_node("MatMul", ["x_dq", "W_dq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=inits,
    )
    return _save(graph, path)


def qdq_matmul_reference(x: np.ndarray, k: int = 8, n: int = 4, signed: bool = True) -> np.ndarray:
    """What :func:`qdq_matmul_model` computes, in numpy."""
    w = matmul_weights(k, n)
    w_scale = np.float32(1 / 127)
    w_dq = np.clip(np.round(w / w_scale), -127, 127).astype(np.float32) * w_scale
    x_scale = np.float32(1 / 64)
    lo, hi, zp = (-128, 127, 0) if signed else (0, 255, 128)
    x_dq = (np.clip(np.round(x / x_scale) + zp, lo, hi) - zp).astype(np.float32) * x_scale
    return x_dq @ w_dq


def qoperator_matmul_model(path: Path, k: int = 8, n: int = 4) -> Path:
    """INT8 QOperator: ``QuantizeLinear -> QLinearMatMul -> DequantizeLinear`` (U8 activations)."""
    w = matmul_weights(k, n)
    w_scale = np.float32(1 / 127)
    inits = [
        numpy_helper.from_array(np.clip(np.round(w / w_scale), -127, 127).astype(np.int8), "W_q"),
        numpy_helper.from_array(np.array(w_scale), "W_scale"),
        numpy_helper.from_array(np.array(0, dtype=np.int8), "W_zp"),
        numpy_helper.from_array(np.array(np.float32(1 / 64)), "x_scale"),
        numpy_helper.from_array(np.array(128, dtype=np.uint8), "x_zp"),
        numpy_helper.from_array(np.array(np.float32(1 / 16)), "y_scale"),
        numpy_helper.from_array(np.array(128, dtype=np.uint8), "y_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"]),
        helper.make_node(
            "QLinearMatMul",
            ["x_q", "x_scale", "x_zp", "W_q", "W_scale", "W_zp", "y_scale", "y_zp"],
            ["y_q"],
        ),
        helper.make_node("DequantizeLinear", ["y_q", "y_scale", "y_zp"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qop_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=inits,
    )
    return _save(graph, path)


def dynamic_int8_model(path: Path, k: int = 8, n: int = 4) -> Path:
    """Dynamic quantization: ``DynamicQuantizeLinear -> MatMulInteger`` as quantize_dynamic emits."""
    w = matmul_weights(k, n)
    w_scale = np.float32(1 / 127)
    inits = [
        numpy_helper.from_array(np.clip(np.round(w / w_scale), -127, 127).astype(np.int8), "W_q"),
        numpy_helper.from_array(np.array(0, dtype=np.int8), "W_zp"),
        numpy_helper.from_array(np.array(w_scale), "W_scale"),
    ]
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
        helper.make_node("MatMulInteger", ["x_q", "W_q", "x_zp", "W_zp"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x_scale", "W_scale"], ["s"]),
        helper.make_node("Mul", ["acc_f", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dyn_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=inits,
    )
    return _save(graph, path)


def float16_model(path: Path, k: int = 8, n: int = 4) -> Path:
    """Float16 weights and activations: ``y = x @ W`` with x, W, y in float16."""
    w = numpy_helper.from_array(matmul_weights(k, n).astype(np.float16), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "fp16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, n])],
        initializer=[w],
    )
    return _save(graph, path)


def external_data_model(path: Path, location: str | None = None, k: int = 64, n: int = 64) -> Path:
    """``matmul_model`` with its weights in an external file (``location`` overrides the path
    written into the model, e.g. ``"../escape.bin"`` for a model that points outside its folder).
    """
    path = Path(path)
    w = numpy_helper.from_array(matmul_weights(k, n), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    data_name = path.name + ".data"
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=data_name, size_threshold=0)
    if location is not None:
        m = onnx.load(str(path), load_external_data=False)
        for init in m.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(m, str(path))
    return path


def tiny_classifier(path: Path, classes: int = 10, size: int = 32, seed: int = 0,
                    doc: str = "") -> Path:
    """A small image classifier: ``image`` 1x3xSxS float -> Conv 3x3 (8) -> Relu ->
    GlobalAveragePool -> Flatten -> Gemm -> ``logits`` 1xclasses. ``seed`` picks the weights
    (two seeds: two "versions" of one model); ``doc`` changes the bytes, not the behaviour."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b")
    fc = numpy_helper.from_array(rng.normal(0, 0.5, (classes, 8)).astype(np.float32), "fc")
    fcb = numpy_helper.from_array(np.zeros(classes, np.float32), "fcb")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["image", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["g"]),
            helper.make_node("Flatten", ["g"], ["f"]),
            helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1),
        ],
        "tiny_classifier",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])],
        initializer=[w, b, fc, fcb],
    )
    graph.doc_string = doc
    return _save(graph, path)


def quantized_classifier(src: Path, path: Path, samples: int = 8) -> Path:
    """``src`` (a `tiny_classifier`) quantized to INT8 QDQ by onnxruntime's tooling on random
    calibration images."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    model = onnx.load(str(src))
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(1)
    batches = iter([{"image": rng.random(dims, dtype=np.float32)} for _ in range(samples)])

    class Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime ships no types
        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(batches, None)

    quantize_static(str(src), str(path), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    per_channel=True)
    return Path(path)


def spatial_output_model(path: Path, size: int = 32) -> Path:
    """An image model whose output is a 1x8xSxS feature map: no classifier or detector can
    decode it (a model for the wrong task)."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "w"], ["features"], pads=[1, 1, 1, 1])],
        "features",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 8, size, size])],
        initializer=[w],
    )
    return _save(graph, path)


def memory_hog_model(path: Path, size: int = 32, mib: int = 1024) -> Path:
    """An image classifier that builds a ``mib`` MiB tensor on every run (Expand of its input to
    a huge shape, then reduced away): it loads, and exhausts a worker's memory limit."""
    n = mib * 1024 * 1024 // 4 // (3 * size * size)
    shape = numpy_helper.from_array(np.array([n, 3, size, size], dtype=np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Expand", ["image", "shape"], ["big"]),
            helper.make_node("ReduceMean", ["big"], ["m"], axes=[0, 2, 3], keepdims=0),
            helper.make_node("Unsqueeze", ["m", "zero"], ["logits"]),
        ],
        "memory_hog",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 3])],
        initializer=[shape,
                     numpy_helper.from_array(np.array([0], dtype=np.int64), "zero")],
    )
    return _save(graph, path)


def nested_if_model(path: Path, depth: int = 2000) -> Path:
    """``depth`` If nodes, each in the then-branch of the one above, as protobuf bytes written
    by hand (onnx.helper's own protobuf refuses to build what is this deep)."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            low, n = n & 0x7F, n >> 7
            out.append(low | (0x80 if n else 0))
            if not n:
                return bytes(out)

    def field(num: int, data: bytes) -> bytes:
        return varint(num << 3 | 2) + varint(len(data)) + data

    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "leaf", [], [y])
    else_only = helper.make_node("If", ["c"], ["y"], else_branch=leaf).SerializeToString()
    body = leaf.SerializeToString()
    for i in range(depth):  # AttributeProto: name=1, g=6, type=20 (GRAPH=5)
        then = field(1, b"then_branch") + field(6, body) + varint(20 << 3) + varint(5)
        body = field(1, else_only + field(5, then)) + field(2, f"g{i}".encode()) \
            + field(12, y.SerializeToString())
    inputs = [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])]
    graph = body + b"".join(field(11, v.SerializeToString()) for v in inputs)
    opset = helper.make_opsetid("", 17).SerializeToString()
    path.write_bytes(varint(1 << 3) + varint(8) + field(8, opset) + field(7, graph))
    return path
