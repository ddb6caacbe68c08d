"""The graph side of quantization: onnxruntime's pre-processing, node names, and which nodes
and operator types stay in float (first convolution, detection head, output writers)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, ModelError

if TYPE_CHECKING:
    import onnx

__all__ = ["DECODE_OPS", "PER_CHANNEL_OPSET", "decode_head", "exclusions", "first_conv",
           "graph_op_types", "head_nodes", "name_nodes", "op_types", "output_nodes", "prepare",
           "upgrade_opset"]

logger = logging.getLogger("edgeinfer._qgraph")  # its name before the package

_CWD_LOCK = threading.Lock()  # the working directory is the process's: one change at a time


PER_CHANNEL_OPSET = 13
"""The first opset whose QuantizeLinear/DequantizeLinear take an ``axis`` (one scale per output
channel). onnxruntime's quantizer writes per-channel scales with ``axis`` whatever the model's
opset, and does not raise the opset for it: Paddle's exports (PP-OCR, opset 11/12) came out as
models onnxruntime refuses (``INVALID_GRAPH ... DequantizeLinear ... Unrecognized attribute:
axis``, first met on the int32 bias of a Conv that graph optimization fused with its Add)."""


# --- graph ------------------------------------------------------------------------------------

def upgrade_opset(src: Path, work: Path, per_channel: bool) -> tuple[Path, str | None]:
    """``src`` converted to `PER_CHANNEL_OPSET` (in ``work``) when per-channel quantization
    needs it, with a note saying so; ``src`` itself and ``None`` when it does not.

    Raises:
        ModelError: onnx's version converter cannot convert the model (the message names the
            ways out).
    """
    import onnx
    from onnx import version_converter

    if not per_channel:
        return src, None
    proto = onnx.load(str(src))
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= PER_CHANNEL_OPSET:
        return src, None
    try:
        converted = version_converter.convert_version(proto, PER_CHANNEL_OPSET)
        onnx.checker.check_model(converted)
    except Exception as exc:  # the converter raises bare RuntimeErrors/ValidationErrors
        raise ModelError(
            f"{src.name} is opset {opset}; per-channel INT8 weights need opset "
            f"{PER_CHANNEL_OPSET} (DequantizeLinear's axis) and onnx cannot convert it "
            f"({type(exc).__name__}: {exc}). Export the model at opset {PER_CHANNEL_OPSET} or "
            "later, or quantize with one scale per tensor (--no-per-channel)") from exc
    out = work / f"opset{PER_CHANNEL_OPSET}.onnx"
    onnx.save(converted, str(out))
    logger.info("%s: opset %d converted to %d for per-channel quantization", src.name, opset,
                PER_CHANNEL_OPSET)
    return out, (f"opset {opset} -> {PER_CHANNEL_OPSET} (per-channel scales need "
                 "DequantizeLinear's axis)")


def prepare(src: Path, work: Path) -> tuple[Path, str]:
    """onnxruntime's pre-processing (shape inference, graph optimization); without symbolic
    shape inference when that fails (it does on YOLOv8n-320), the model as it is when both do."""
    from onnxruntime.quantization import quant_pre_process

    out = work / "prepared.onnx"
    model = str(src.resolve())  # before the chdir below: a relative path is the caller's
    attempts: tuple[tuple[str, dict[str, Any]], ...] = (("symbolic shape inference + optimization", {}),
                ("ONNX shape inference + optimization (symbolic shape inference failed)",
                 {"skip_symbolic_shape": True}))
    for note, kwargs in attempts:
        try:
            # A failed symbolic shape inference dumps sym_shape_infer_temp.onnx (and its weights)
            # into the current directory: let that be the work folder, removed afterwards.
            with _CWD_LOCK, contextlib.chdir(work):
                quant_pre_process(model, str(out), **kwargs)
            return out, note
        except Exception as exc:  # onnxruntime raises bare Exceptions here
            logger.info("quantization pre-processing (%s) failed: %s", note, exc)
    return src, "none (pre-processing failed; the model as it is)"


def name_nodes(path: Path) -> onnx.ModelProto:
    """The model with every node named (exclusion and onnxruntime's quantizer go by names)."""
    import onnx

    proto = onnx.load(str(path))
    seen = {n.name for n in proto.graph.node if n.name}
    for i, node in enumerate(proto.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in seen:
                name += "_"
            node.name = name
            seen.add(name)
    return proto


def graph_op_types(graph: onnx.GraphProto) -> set[str]:
    """Operator types of ``graph`` and its subgraphs."""
    ops: set[str] = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attr in node.attribute:
            for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                ops |= graph_op_types(g)
    return ops


def first_conv(proto: onnx.ModelProto) -> str | None:
    """The first ``Conv`` in topological order (ONNX graphs are stored sorted)."""
    return next((n.name for n in proto.graph.node if n.op_type == "Conv"), None)


def head_nodes(proto: onnx.ModelProto) -> list[str]:
    """The nodes after the last feature convolution: those from which no ``Conv`` with more
    than one output channel can be reached.

    Why this rule: what follows a backbone's last convolutions is decoding arithmetic (YOLOv8's
    Concat/Reshape/Split, the DFL softmax and its one-channel Conv, the box Sub/Add/Mul, the
    class Sigmoid; a classifier's pooling/Gemm/Softmax). It mixes tensors of different ranges
    (box pixels 0..320 next to scores 0..1 in one Concat), which one INT8 scale cannot hold. A
    one-output-channel Conv (the DFL expectation) is a fixed weighted sum, not a feature layer,
    so it belongs to the head too.
    """
    inits = {t.name: t for t in proto.graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in proto.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def feature_conv(node: Any) -> bool:
        w = inits.get(node.input[1]) if node.op_type == "Conv" and len(node.input) > 1 else None
        return node.op_type == "Conv" and (w is None or not w.dims or w.dims[0] > 1)

    feeds_conv: dict[str, bool] = {}
    for node in reversed(proto.graph.node):  # consumers come later in topological order
        feeds_conv[node.name] = any(
            feature_conv(c) or feeds_conv.get(c.name, False)
            for out in node.output for c in consumers.get(out, ()))
    return [n.name for n in proto.graph.node if not feeds_conv[n.name] and not feature_conv(n)]


DECODE_OPS = frozenset({"Concat", "Sigmoid", "Softmax"})
"""Operators that make a head a decode head: the box/score Concat and the score activations."""


def decode_head(proto: onnx.ModelProto) -> list[str]:
    """The decode head: `head_nodes` when they hold a `DECODE_OPS` operator, else none.

    Kept in float by default. Quantized, a head turns scores into a handful of levels (a
    Sigmoid's output gets one INT8 scale for 0..1: percentile calibration on mostly-empty
    frames clipped a YOLO-style head's scores at 0.85) or mixes box pixels and scores in one
    Concat scale; left float it costs little (a detector's or classifier's last arithmetic, no
    feature layer), and the convolutions before it stay INT8.
    """
    head = head_nodes(proto)
    names = set(head)
    ops = {n.op_type for n in proto.graph.node if n.name in names}
    return head if ops & DECODE_OPS else []


_COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


def output_nodes(proto: onnx.ModelProto) -> list[str]:
    """Nodes that write a graph output and do no heavy compute: kept in float always.

    Quantizing a model's output saves nothing (the caller wants floats) and can ruin it: YOLOv8
    ends in a Concat of box pixels (0..320) and class scores (0..1), and one INT8 scale for both
    rounds every score to 0 or 1.25. Left float, the Concat's inputs keep scales of their own.
    """
    outputs = {o.name for o in proto.graph.output}
    return [n.name for n in proto.graph.node
            if n.op_type not in _COMPUTE_OPS and outputs.intersection(n.output)]


def exclusions(proto: onnx.ModelProto, src: Path, names: Iterable[str], first: bool,
                head: bool, warnings: list[str]) -> list[str]:
    import onnx

    wanted = [n for n in names if n]
    present = {n.name for n in proto.graph.node}
    if wanted:
        original = {n.name for n in onnx.load(str(src), load_external_data=False).graph.node}
        unknown = [n for n in wanted if n not in original and n not in present]
        if unknown:
            raise ConfigError(f"exclude_nodes: no node named {', '.join(unknown)} in {src.name}")
        gone = [n for n in wanted if n not in present]
        if gone:
            msg = f"exclude_nodes: {', '.join(gone)} fused away by pre-processing"
            warnings.append(msg)
            logger.info("%s", msg)  # the card carries it; the CLI prints it once
    excluded = [n for n in wanted if n in present]
    if first:
        conv = first_conv(proto)
        if conv is None:
            raise ConfigError(f"exclude_first_conv: {src.name} has no Conv")
        excluded.append(conv)
    if head:
        excluded += head_nodes(proto)
    return list(dict.fromkeys(excluded))


def op_types(proto: onnx.ModelProto, allowed: Iterable[str], exclude: Iterable[str],
              src: str, what: str, subgraphs: bool = False) -> list[str]:
    """The graph's operator types onnxruntime can quantize, less those kept in float."""
    present = graph_op_types(proto.graph) if subgraphs else {n.op_type for n in proto.graph.node}
    ops = sorted((present & set(allowed)) - set(exclude))
    if not ops:
        raise ModelError(f"{src} has no operators that {what} INT8 quantization applies to "
                         f"(its operators: {', '.join(sorted(present)) or 'none'})")
    return ops
