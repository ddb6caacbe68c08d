"""load_model on TFLite files: the same public face as ONNX, quantized I/O through Model.run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import InvalidInputError, ModelFormatError
from edgeinfer.testing import tflite_models as tm


def test_blazeface_through_load_model_matches_raw_litert(blazeface_path: Path) -> None:
    from ai_edge_litert.interpreter import Interpreter

    x = np.random.default_rng(3).random((1, 128, 128, 3), dtype=np.float32)
    with edgeinfer.load_model(blazeface_path, threads=2, providers="litert") as m:
        assert m.format == "tflite" and m.quantization == "float16"  # MediaPipe stores fp16 weights
        assert m.provider == "xnnpack" and m.report.warmed_up
        assert {s.name: s.shape for s in m.outputs} == {
            "regressors": (1, 896, 16), "classificators": (1, 896, 1)}
        out = m.run(x)
        info = m.info()
    raw = Interpreter(str(blazeface_path), num_threads=2)
    raw.allocate_tensors()
    raw.set_tensor(raw.get_input_details()[0]["index"], x)
    raw.invoke()
    for d in raw.get_output_details():
        np.testing.assert_allclose(out[d["name"]], raw.get_tensor(d["index"]), rtol=1e-5, atol=1e-5)
    assert info["format"] == "tflite" and "opset" not in info


@pytest.mark.arm64
def test_int8_model_takes_float_through_the_public_api(tmp_path: Path) -> None:
    path = tm.int8_fc_model(tmp_path / "q.tflite")
    with edgeinfer.load_model(path) as m:
        assert m.quantization == "int8"
        assert m.inputs[0].quantization is not None and m.inputs[0].dtype == "int8"
        scale, zp = m.inputs[0].quantization
        x = np.random.default_rng(4).uniform(-1, 1, m.inputs[0].shape).astype(np.float32)
        y = m.run(x)
        y_int = m.run(tm.quantize(x, scale, zp))  # already-quantized input passes through
        with pytest.raises(InvalidInputError, match="expected dtype int8, got int32"):
            m.run(x.astype(np.int32))
    (name,) = y
    np.testing.assert_array_equal(y[name], y_int[name])
    assert y[name].dtype == np.float32


def test_corrupt_tflite_through_load_model(tmp_path: Path, blazeface_path: Path) -> None:
    bad = tmp_path / "cut.tflite"
    bad.write_bytes(blazeface_path.read_bytes()[:5000])
    with pytest.raises(ModelFormatError):
        edgeinfer.load_model(bad)
