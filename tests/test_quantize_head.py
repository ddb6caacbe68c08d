"""A detector's decode head stays float by default, and the accuracy report fails a model whose
scores drift even when mAP still ranks it perfect; opset < 13 graphs get per-channel INT8."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer
from edgeinfer.config.pipeline import DetectTask, PreprocessConfig
from edgeinfer.errors import ModelError
from edgeinfer.quantize import quantize_model
from edgeinfer.tasks.metrics import MIN_RECALL, score_checks
from edgeinfer.testing.detector_models import conv_detector_model, detector_images

SIZE = 64
CONFIG = DetectTask(decoder="yolov8", preprocess=PreprocessConfig(size=[SIZE, SIZE]))
HEAD = ["box_grid", "box_rows", "cls_rows", "scores", "head", "grid_rows"]


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("detector")
    return conv_detector_model(folder / "det.onnx"), detector_images(folder / "images", 60)


def _scores(path: Path, image: Path) -> np.ndarray:
    x = cv2.imread(str(image))[..., ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255
    with edgeinfer.load_model(path) as m:
        return np.asarray(m.run({"images": x})["output0"])[0, 4:]


def test_decode_head_stays_float_and_keeps_the_scores(detector: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    model, images = detector
    card = quantize_model(model, tmp_path / "q.onnx", images, config=CONFIG)
    s = card.data["settings"]
    assert s["float_head"] == HEAD and s["float_outputs"] == ["tail"]
    assert s["quantize_head"] is False and s["exclude_nodes"] == []
    quantized = {n.name for n in onnx.load(str(card.path)).graph.node}
    assert not any(f"{t}_QuantizeLinear" in quantized for t in ("scores", "rows", "boxes"))
    r = card.report
    assert card.passed is True and r["verdict"] == "pass" and r["failures"] == []
    assert r["map50"] == 1.0 and r["recall_at_threshold"] == 1.0
    assert r["score_drift"]["p95_abs"] < 0.02 and r["score_drift"]["ks"] < 0.05
    for image in sorted(images.iterdir())[:5]:
        ref, q = _scores(model, image), _scores(card.path, image)
        assert np.abs(ref - q).max() < 0.02 and q.max() >= ref.max() - 0.01  # not clipped


def test_quantized_head_fails_the_report_though_map_ranks_it_well(
        detector: tuple[Path, Path], tmp_path: Path) -> None:
    """The old way: one INT8 scale for box pixels and scores in the Concat caps every score
    near 0.95 and mAP hardly notices; the scores' distribution does."""
    model, images = detector
    card = quantize_model(model, tmp_path / "q.onnx", images, config=CONFIG, quantize_head=True)
    r = card.report
    assert card.data["settings"]["float_head"] == [] and r["map50"] > 0.99
    assert card.passed is False and r["verdict"] == "fail"
    assert any("score distributions differ" in f for f in r["failures"])
    assert r["score_drift"]["quantiles"]["compared"][-1] < r["score_drift"]["quantiles"][
        "float"][-1] - 0.03
    assert not any("fails the accuracy check" in w for w in card.warnings)  # once: the report's
    assert card.path.is_file()  # written, for inspection


def test_cli_exits_65_on_a_failing_report(detector: tuple[Path, Path], tmp_path: Path) -> None:
    model, images = detector
    cfg = tmp_path / "det.yaml"
    cfg.write_text(f"pipelines:\n  - name: det\n    source: {{type: images, uri: '{images}'}}\n"
                   f"    model: {{path: '{model}'}}\n    task: {{type: detect, decoder: yolov8, "
                   f"preprocess: {{size: [{SIZE}, {SIZE}]}}}}\n")
    base = [sys.executable, "-m", "edgeinfer", "quantize", str(model), str(tmp_path / "q.onnx"),
            "--calibration", str(images), "-c", str(cfg)]
    bad = subprocess.run([*base, "--quantize-head"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert bad.returncode == ModelError.exit_code, bad.stderr
    assert "verdict       FAIL (on " in bad.stdout
    assert "float boxes at score >= 0.25 in 12 inputs): score distributions differ" in bad.stdout
    assert "fails the accuracy check against the float model" in bad.stderr
    good = subprocess.run([*base, "--force", "--json"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["report"]["verdict"] == "pass"


# --- the checks themselves ------------------------------------------------------------------

def _dets(scores: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = len(scores)
    boxes = np.array([[20.0 * i, 0, 20.0 * i + 10, 10] for i in range(n)], np.float32)
    return boxes.reshape(-1, 4), np.asarray(scores, np.float32), np.zeros(n, np.intp)


def _checks(ref: list[float], got: list[float], threshold: float = 0.25) -> dict[str, Any]:
    truth = [_dets([s for s in ref if s >= threshold])]
    b, s, c = _dets(got)
    keep = s >= threshold
    return score_checks(truth, [(b[keep], s[keep], c[keep])], [(b, s, c)], threshold)


def test_score_checks_pass_rounding_and_fail_clipping_and_lost_recall() -> None:
    ref = list(np.linspace(0.3, 0.99, 50))
    same = _checks(ref, [v + 0.01 for v in ref])
    assert same["failures"] == [] and same["recall_at_threshold"] == 1.0
    clipped = _checks(ref, [min(v, 0.85) for v in ref])  # the ranking is intact
    assert clipped["recall_at_threshold"] == 1.0
    assert any("distributions differ" in f for f in clipped["failures"])
    halved = _checks(ref, [v / 2 for v in ref])  # most fall under the threshold
    assert halved["recall_at_threshold"] < MIN_RECALL
    assert any(f.startswith("recall at score >= 0.25") for f in halved["failures"])
    assert any(f.startswith("scores drift") for f in halved["failures"])
    assert _checks([0.1], [0.1])["failures"] == []  # no float box at the threshold: no verdict basis


# --- opset < 13 -----------------------------------------------------------------------------

def _opset11_conv(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1] * 4),
         helper.make_node("Add", ["c", "b4"], ["a"], name="bias"),  # Paddle's bias: an Add
         helper.make_node("Relu", ["a"], ["y"], name="relu")],
        "paddle_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        initializer=[w, numpy_helper.from_array(numpy_helper.to_array(b).reshape(1, 8, 1, 1),
                                                "b4")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    onnx.save(model, str(path))
    return path


def test_opset_11_graph_gets_per_channel_int8_that_loads(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    model = _opset11_conv(tmp_path / "old.onnx")
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(1).random((12, 1, 3, 16, 16),
                                                                     dtype=np.float32))
    card = quantize_model(model, tmp_path / "q.onnx", tmp_path / "c.npz")
    assert card.data["settings"]["opset_upgrade"] == (
        "opset 11 -> 13 (per-channel scales need DequantizeLinear's axis)")
    with edgeinfer.load_model(card.path) as m:
        assert m.quantization == "int8-qdq"
    assert card.report["outputs"]["y"]["cosine_min"] > 0.99
    card = quantize_model(model, tmp_path / "t.onnx", tmp_path / "c.npz", per_channel=False)
    assert card.data["settings"]["opset_upgrade"] is None
    assert {o.version for o in onnx.load(str(card.path)).opset_import if o.domain == ""} == {11}

    def refuse(*_: object) -> None:
        raise RuntimeError("no adapter")

    monkeypatch.setattr(onnx.version_converter, "convert_version", refuse)
    with pytest.raises(ModelError, match=r"opset 11; per-channel .*--no-per-channel"):
        quantize_model(model, tmp_path / "r.onnx", tmp_path / "c.npz")
    assert not (tmp_path / "r.onnx").exists()
