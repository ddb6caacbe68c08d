"""``preprocess: {resize: center_crop}``: the classifiers' preprocessing (Ultralytics-cls: the
shorter side to the size, keep the centre; torchvision: 256 -> 224, ``crop_fraction: 0.875``),
and ``classify`` choosing it by default for an Ultralytics classify export."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgeinfer
from edgeinfer.config.pipeline import ClassifyTask as ClassifyConfig
from edgeinfer.config.pipeline import PreprocessConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Frame
from edgeinfer.runtime.base import TensorSpec
from edgeinfer.tasks import make_task
from edgeinfer.tasks.classify import ClassifyTask
from edgeinfer.tasks.preprocess import Preprocessor

SPEC = TensorSpec("images", (1, 3, 224, 224), "float32")


def _frame(w: int = 1280, h: int = 720, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize(("fraction", "scaled"), [(None, (398, 224)), (0.875, (455, 256))])
def test_center_crop_matches_resize_then_crop(fraction: float | None,
                                              scaled: tuple[int, int]) -> None:
    image = _frame()
    pre = Preprocessor(PreprocessConfig(resize="center_crop", crop_fraction=fraction), SPEC)

    tensor, tf = pre(image)

    big = cv2.resize(image, scaled, interpolation=cv2.INTER_LINEAR)
    ox, oy = round((scaled[0] - 224) / 2), round((scaled[1] - 224) / 2)
    want = big[oy:oy + 224, ox:ox + 224, ::-1].transpose(2, 0, 1)[None] / np.float32(255)
    np.testing.assert_allclose(tensor, want, atol=1e-6)
    # The crop's corners map back into the frame's centre region
    (x0, y0), (x1, y1) = tf.to_source(np.array([[0.0, 0.0], [224.0, 224.0]])).tolist()
    assert (x0 + x1) / 2 == pytest.approx(640, abs=2) and (y0 + y1) / 2 == pytest.approx(360, abs=2)
    assert y1 - y0 == pytest.approx(720 * (fraction or 1.0), abs=3)


def test_crop_fraction_needs_center_crop() -> None:
    with pytest.raises(ConfigError, match="crop_fraction applies to resize: center_crop"):
        Preprocessor(PreprocessConfig(crop_fraction=0.875), SPEC)


def _classifier(path: Path, metadata: dict[str, str]) -> Path:
    """Scores = the mean of each RGB channel: a red centre on a blue frame reads red only when
    the frame's sides are cropped off."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["output0"])],
        "cls", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for k, v in metadata.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    onnx.save(model, str(path))
    return path


def test_an_ultralytics_classifier_gets_center_crop_and_its_names(tmp_path: Path) -> None:
    image = np.zeros((720, 1280, 3), np.uint8)
    image[:, :] = (255, 0, 0)  # blue (BGR)
    image[:, 280:1000] = (0, 0, 255)  # a red centre, 720 wide: the whole centre crop
    frame = Frame(0, 0.0, 0.0, image)
    meta = {"author": "Ultralytics", "task": "classify", "imgsz": "[32, 32]",
            "names": "{0: 'red', 1: 'green', 2: 'blue'}"}
    path = _classifier(tmp_path / "yolo11n-cls.onnx", meta)
    with edgeinfer.load_model(path) as m:
        task = make_task(ClassifyConfig(softmax="no"), m)
        assert isinstance(task, ClassifyTask)
        assert task.preprocessor.resize == "center_crop"
        feeds, tf = task.preprocess(frame)
        top = task.postprocess(m.run(feeds), frame, tf).top or ()
        assert top[0].label == "red" and top[0].score == pytest.approx(1.0, abs=0.02)
        # configured preprocessing is kept: a stretch sees the blue sides too
        plain = make_task(ClassifyConfig(softmax="no", preprocess=PreprocessConfig(
            resize="stretch")), m)
        feeds, tf = plain.preprocess(frame)
        assert (plain.postprocess(m.run(feeds), frame, tf).top or ())[0].score < 0.7
