"""docs/models.md's configs run: each block's model file (an export a user brings: none ships in
a wheel) is stood in for by a model built in that export's exact output layout, with people
planted where the frame has them; the block's task keys are used as written (auto decoder,
labels, preprocess), its camera is a 1280x720 frame. Each must decode the planted people as
the doc says, with the decoder it names or implies."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml

import edgeinfer
from edgeinfer.config import parse_config
from edgeinfer.frames import Frame
from edgeinfer.tasks import make_task
from edgeinfer.testing import export_layouts as el
from edgeinfer.testing import onnx_models as om
from edgeinfer.testing import ultralytics_layouts as ul

ROOT = Path(__file__).resolve().parents[2]
PEOPLE = ((300.0, 120.0, 560.0, 680.0), (760.0, 200.0, 980.0, 610.0))  # source pixels
COCO = [f"class{i}" for i in range(80)]
COCO[0], COCO[2] = "person", "car"


def _yolo11n(path: Path, size: tuple[int, int] = (640, 640)) -> Path:
    boxes = np.array([el.to_input(b, size) for b in PEOPLE], np.float32)
    planted = ul.Planted(boxes, np.zeros(2, np.intp), np.array([0.9, 0.8], np.float32))
    meta = el.ultralytics_metadata("detect", COCO, size)
    return ul.yolov8_model(path, planted, 80, size, metadata=meta)


def _pose(path: Path, size: tuple[int, int] = (640, 640)) -> Path:
    dets = [el.Planted(el.to_input(b, size), 0, s) for b, s in zip(PEOPLE, (0.9, 0.8))]
    points = [np.column_stack([np.linspace(d.box[0], d.box[2], 17),
                               np.linspace(d.box[1], d.box[3], 17), np.full(17, 0.9)])
              for d in dets]
    meta = el.ultralytics_metadata("pose", ["person"], size, kpt_shape="[17, 3]")
    return el.pose_model(path, dets, points, size=size, metadata=meta)


def _ssd(path: Path, size: tuple[int, int] = (300, 300)) -> Path:
    # TFLite's post-processed outputs, class ids from 0 = COCO category 1 (person)
    dets = [el.Planted(el.to_input(b, size), 0, s) for b, s in zip(PEOPLE, (0.9, 0.8))]
    return el.ssd_model(path, dets, size=size)


def _yolox(path: Path, size: tuple[int, int] = (640, 640)) -> Path:
    dets = [el.Planted(el.to_input(b, size, anchor="top-left"), 0, s)
            for b, s in zip(PEOPLE, (0.9, 0.8))]
    return el.yolox_model(path, dets, size=size)


def _classifier(path: Path) -> Path:
    (path.parent / "imagenet_labels.txt").write_text("\n".join(f"c{i}" for i in range(10)))
    return om.tiny_classifier(path, classes=10, size=224)


BUILDERS: dict[str, Callable[[Path], Path]] = {
    "yolo11n.onnx": _yolo11n, "yolo11n-pose.onnx": _pose, "ssd_mobilenet_v2.tflite": _ssd,
    "yolox_s.onnx": _yolox, "mobilenet_v3.onnx": _classifier,
}


def _blocks() -> list[dict[str, Any]]:
    text = (ROOT / "docs" / "models.md").read_text()
    found = [yaml.safe_load(b) for b in re.findall(r"^```ya?ml\n(.*?)^```", text, re.S | re.M)]
    return [b for b in found if isinstance(b, dict) and "model" in b]


BLOCKS = _blocks()


def test_every_models_doc_block_has_a_stand_in() -> None:
    assert {Path(b["model"]["path"]).name for b in BLOCKS} == set(BUILDERS)


@pytest.mark.parametrize("block", BLOCKS, ids=[Path(b["model"]["path"]).name for b in BLOCKS])
def test_a_models_doc_config_decodes_its_layout(block: dict[str, Any], tmp_path: Path) -> None:
    name = Path(block["model"]["path"]).name
    model_path = BUILDERS[name](tmp_path / name)
    item = {**block, "name": "doc", "model": {**block["model"], "path": str(model_path)}}
    config = parse_config(yaml.safe_dump({"pipelines": [item]}), source=f"models.md {name}",
                          base_dir=tmp_path)
    pc = config.pipelines[0]
    frame = Frame(0, 0.0, 0.0, np.full((720, 1280, 3), 90, np.uint8))
    with edgeinfer.load_model(model_path, probe=False) as model:
        task = make_task(pc.task, model)
        feeds, context = task.preprocess(frame)
        part = task.postprocess(model.run(feeds), frame, context)
    if name == "mobilenet_v3.onnx":  # the classifier: a top-k of its label file's names
        assert part.top and all(c.label.startswith("c") for c in part.top)
        return
    found = part.detections or ()
    assert [d.label for d in found] == ["person", "person"], found
    for d, truth in zip(found, PEOPLE):
        assert _iou(d.box, truth) > 0.9, (d.box, truth)
    if name == "yolo11n-pose.onnx":
        assert all(d.keypoints is not None and len(d.keypoints) == 17 for d in found)


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - iw * ih
    return iw * ih / union


def _plugin_block() -> str:
    """The Python block of 'Bringing another layout' (the decoder plug-in example)."""
    text = (ROOT / "docs" / "models.md").read_text()
    section = text[text.index("## Bringing another layout"):]
    found = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert found, "docs/models.md: 'Bringing another layout' has no python block"
    return found[1]


def test_the_decoder_plugin_example_runs_as_printed(tmp_path: Path) -> None:
    """Issue 30: the skeleton as printed raised TypeError (abstract methods) once used. Run the
    block word for word in a fresh interpreter, in a folder holding what it names (mine.onnx in
    its 1 x N x 6 layout, photos/): it decodes the planted people. And where the doc says it
    does not work yet: the command line, another process, refuses `decoder: mine`."""
    rows = np.zeros((1, 10, 6), np.float32)  # x1, y1, x2, y2, score, class; zero rows padding
    rows[0, 0] = [40, 60, 120, 300, 0.9, 0]
    rows[0, 1] = [200, 100, 300, 180, 0.8, 1]
    el.const_model(tmp_path / "mine.onnx", {"detections": rows}, size=(320, 320))
    (tmp_path / "photos").mkdir()
    cv2.imwrite(str(tmp_path / "photos" / "street.png"), np.full((320, 320, 3), 90, np.uint8))
    done = subprocess.run([sys.executable, "-c", _plugin_block()], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "label='person'" in done.stdout and "label='car'" in done.stdout, done.stdout
    assert "box=(40.0, 60.0, 120.0, 300.0)" in done.stdout, done.stdout
    config = tmp_path / "mine.yaml"
    config.write_text("pipelines:\n  - name: mine\n    source: {type: images, uri: photos/}\n"
                      "    model: {path: mine.onnx}\n"
                      "    task: {type: detect, decoder: mine, labels: [person, car]}\n")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(config)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 78 and "unknown decoder 'mine'" in done.stderr, done
