"""``edgeinfer quantize``: INT8 models calibrated through the pipeline's own preprocessing, with
an accuracy report against the float original.

- ``run``: the options and settings (static or dynamic, the layout per target CPU);
- ``write``: quantizing with onnxruntime's tooling, and the model and its card written in place;
- ``graph``: reading the ONNX graph (what to exclude: the first conv, the detection head, the
  decode head kept float by default), and the opset per-channel scales need;
- ``accuracy``: calibration and held-out samples, and the quantized model's accuracy.
"""

from __future__ import annotations

from .run import (
    FLOAT_TYPES,
    MIN_SAMPLES,
    TARGETS,
    ModelCard,
    decode_head,
    first_conv,
    graph_op_types,
    head_nodes,
    is_recurrent,
    output_nodes,
    quantize_model,
)

__all__ = ["FLOAT_TYPES", "MIN_SAMPLES", "TARGETS", "ModelCard", "decode_head", "first_conv",
           "graph_op_types", "head_nodes", "is_recurrent", "output_nodes", "quantize_model"]
