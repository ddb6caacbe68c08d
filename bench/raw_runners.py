"""Each backend opened raw, as a user who pip-installed it would: onnxruntime, OpenVINO through
its own API, LiteRT. Each ``raw_*`` returns a runner, ``feeds -> outputs by name``
(``bench/backends.py``, ``bench/e2e.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def raw_ort(path: Path, threads: int, *, spin: bool | None, level: str = "all") -> Runner:
    """onnxruntime as a user opens it: ``spin=None`` and ``level="all"`` are its defaults."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    if spin is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, s.run(names, feeds)))

    return run


def raw_openvino(path: Path, threads: int, shapes: dict[str, tuple[int, ...]],
                 precision: str = "fp32") -> Runner:
    """OpenVINO's own API, f32 unless asked (its CPU default is bf16 where the CPU has it),
    LATENCY."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    dynamic = {p.get_any_name(): shapes[p.get_any_name()] for p in model.inputs
               if p.get_partial_shape().is_dynamic and p.get_any_name() in shapes}
    if dynamic:
        model.reshape(dynamic)
    hint = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}[precision]
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint,
                                                 "INFERENCE_NUM_THREADS": str(threads),
                                                 "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = request.infer(feeds)
        return {n: np.array(result[o]) for n, o in zip(names, compiled.outputs)}

    return run


def raw_litert(path: Path, threads: int) -> Runner:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=threads)
    it.allocate_tensors()
    ins = it.get_input_details()
    outs = it.get_output_details()

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for d, v in zip(ins, feeds.values()):
            it.set_tensor(d["index"], v.astype(d["dtype"]).reshape(d["shape"]))
        it.invoke()
        return {d["name"]: it.get_tensor(d["index"]) for d in outs}

    return run
