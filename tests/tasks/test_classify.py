"""ClassifyTask on tiny ONNX classifiers built here: global average pool -> matmul to 5 classes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer
from edgeinfer.config.pipeline import ClassifyTask as ClassifyConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Frame
from edgeinfer.tasks import make_task
from edgeinfer.tasks.classify import ClassifyTask, softmax

LABELS = ["cat", "dog", "bird", "fish", "frog"]
W = np.array([[4.0, -2.0, 1.0, 0.5, -1.0],
              [-3.0, 5.0, 0.0, 1.0, 2.0],
              [1.0, 1.0, -4.0, 3.0, 0.0]], dtype=np.float32)  # rows: R, G, B means
B = np.array([0.1, 0.0, -0.2, 0.3, 0.0], dtype=np.float32)


def classifier(path: Path, probabilities: bool = False, outputs: int = 1) -> Path:
    """images [1, 3, 16, 16] -> GlobalAveragePool -> Flatten -> x @ W + B (-> Softmax)."""
    nodes = [helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
             helper.make_node("Flatten", ["pooled"], ["flat"]),
             helper.make_node("MatMul", ["flat", "W"], ["mm"]),
             helper.make_node("Add", ["mm", "B"], ["logits"])]
    out = "logits"
    if probabilities:
        nodes.append(helper.make_node("Softmax", ["logits"], ["probs"], axis=-1))
        out = "probs"
    outs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 5])]
    if outputs == 2:
        outs.append(helper.make_tensor_value_info("flat", TensorProto.FLOAT, [1, 3]))
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 16, 16])], outs,
        initializer=[numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _classify(task: ClassifyTask, bgr: tuple[int, int, int]) -> list:
    frame = Frame(0, 0.0, 0.0, np.full((32, 32, 3), bgr, dtype=np.uint8))
    feeds, ctx = task.preprocess(frame)
    return list(task.postprocess(task.model.run(feeds), frame, ctx).top or ())


def _expected_logits(bgr: tuple[int, int, int]) -> np.ndarray:
    rgb = np.array(bgr[::-1], dtype=np.float32) / 255  # a uniform picture pools to its colour
    return rgb @ W + B


def test_top_k_with_softmax_and_labels(tmp_path: Path) -> None:
    with edgeinfer.load_model(classifier(tmp_path / "c.onnx")) as m:
        task = make_task(ClassifyConfig(labels=LABELS, top_k=3), m)
        top = _classify(task, (30, 200, 90))  # type: ignore[arg-type]
    probs = softmax(_expected_logits((30, 200, 90)).astype(np.float64))
    order = np.argsort(-probs)[:3]
    assert [c.label for c in top] == [LABELS[i] for i in order]
    assert [c.class_id for c in top] == list(order)
    np.testing.assert_allclose([c.score for c in top], probs[order], atol=1e-5)


def test_softmax_modes(tmp_path: Path) -> None:
    colour = (250, 10, 120)
    logits = _expected_logits(colour)
    with edgeinfer.load_model(classifier(tmp_path / "c.onnx")) as m:
        raw = _classify(ClassifyTask(ClassifyConfig(softmax="no"), m), colour)
        # Raw logits include negative ones: a threshold of 0 keeps them all.
        assert len(raw) == 5 and min(c.score for c in raw) < 0
        np.testing.assert_allclose(sorted(c.score for c in raw), sorted(logits), atol=1e-5)
        assert [c.label for c in raw] == [str(i) for i in np.argsort(-logits)]  # no labels
    with edgeinfer.load_model(classifier(tmp_path / "p.onnx", probabilities=True)) as m:
        probs = softmax(logits.astype(np.float64))
        auto = _classify(ClassifyTask(ClassifyConfig(), m), colour)
        np.testing.assert_allclose([c.score for c in auto], np.sort(probs)[::-1], atol=1e-5)
        twice = _classify(ClassifyTask(ClassifyConfig(softmax="yes"), m), colour)
        np.testing.assert_allclose([c.score for c in twice], np.sort(softmax(probs))[::-1],
                                   atol=1e-5)


def test_threshold_and_top_k_beyond_classes(tmp_path: Path) -> None:
    with edgeinfer.load_model(classifier(tmp_path / "c.onnx")) as m:
        everything = _classify(ClassifyTask(ClassifyConfig(top_k=50), m), (40, 0, 255))
        assert len(everything) == 5
        assert sum(c.score for c in everything) == pytest.approx(1.0, abs=1e-5)
        cut = everything[1].score
        kept = _classify(ClassifyTask(ClassifyConfig(top_k=5, score_threshold=cut), m),
                         (40, 0, 255))
        assert [c.class_id for c in kept] == [c.class_id for c in everything[:2]]


def test_mismatches_are_refused(tmp_path: Path) -> None:
    with edgeinfer.load_model(classifier(tmp_path / "c.onnx")) as m:
        with pytest.raises(ConfigError, match=r"labels has 4 entries.*logits \[1, 5\].*5 classes"):
            ClassifyTask(ClassifyConfig(labels=LABELS[:4]), m)
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("\n".join(LABELS + ["extra"]) + "\n\n")
    with edgeinfer.load_model(classifier(tmp_path / "c2.onnx")) as m:
        with pytest.raises(ConfigError, match="labels has 6 entries"):
            ClassifyTask(ClassifyConfig(labels=str(labels_file)), m)
    with edgeinfer.load_model(classifier(tmp_path / "two.onnx", outputs=2)) as m:
        with pytest.raises(ConfigError, match="one image input and one output"):
            ClassifyTask(ClassifyConfig(), m)
