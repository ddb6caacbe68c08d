"""Issue 30: decoders judged on every dimension they rely on.

* ``decoder: auto`` against lookalikes, models built here in the layout another tool exports
  with one dimension a decoder relies on changed (a MediaPipe detector whose regressors are 18
  wide, anchors of another input size, labels of another class count, rows that do not line
  up): each is refused naming what does not fit, and the real models are still picked.
* A named decoder on another layout's head: the first-frames check refuses each planted case
  with the right decoder named, and stays quiet on right decoders, real models and real
  pictures.
* The refusal of ``auto`` is short (the closest layouts and the fix); ``edgeinfer info MODEL
  --task detect`` gives every decoder's account.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.errors import ConfigError, OutputLayoutError
from edgeinfer.frames import Detection, Frame
from edgeinfer.model import samples
from edgeinfer.tasks.decoders import DECODERS
from edgeinfer.tasks.decoders.grids import grid_centres
from edgeinfer.tasks.decoders.sanity import OutputCheck
from edgeinfer.tasks.detect import DetectTask
from edgeinfer.testing import export_layouts as el
from edgeinfer.testing import ultralytics_layouts as ul
from edgeinfer.testing.onnx_models import add_model

_SAMPLES = samples.samples_dir()  # read before conftest points the cache at a temporary dir


def _mediapipe(path: Path, anchors: int, width: int, size: int) -> Path:
    """A MediaPipe SSD detector's outputs as its TFLite -> ONNX conversion names them:
    ``regressors 1 x A x width`` (box offsets and sizes in input pixels, then keypoints) and
    ``classificators 1 x A x 1`` logits, one anchor scoring high; NHWC float input."""
    regs = np.zeros((1, anchors, width), np.float32)
    regs[0, :, 2:4] = size / 4  # every anchor's box a quarter of the input
    logits = np.full((1, anchors, 1), -8.0, np.float32)
    logits[0, 10, 0] = 4.0
    return el.const_model(path, {"regressors": regs, "classificators": logits},
                          size=(size, size), layout="nhwc")


def _refusal(path: Path, **config: object) -> str:
    with edgeinfer.load_model(path, probe=False) as m:
        with pytest.raises(ConfigError) as caught:
            DetectTask(DetectConfig(**config), m)  # type: ignore[arg-type]
    return str(caught.value)


# --- decoder: auto against lookalikes ------------------------------------------------------------


def _palm(path: Path) -> Path:
    # MediaPipe's palm detector: 192 x 192, the short-range face model's anchor strides (2016
    # anchors at 192), 7 keypoints: 4 + 2 x 7 = 18 wide.
    return _mediapipe(path, 2016, 18, 192)


def _face_anchors_of_no_face_model(path: Path) -> Path:
    # 16 wide like BlazeFace, but 2016 anchors at 192 x 192: the short-range layout at a size
    # no face model has (the full-range 192 model has 2304).
    return _mediapipe(path, 2016, 16, 192)


def _yolov5_of_80(path: Path) -> Path:
    boxes = np.array([[100, 100, 300, 400]], np.float32)
    planted = ul.Planted(boxes, np.zeros(1, np.intp), np.array([0.9], np.float32))
    return ul.yolov5_model(path, planted, 80)


def _ssd_rows_apart(path: Path) -> Path:
    outs = {"StatefulPartitionedCall:0": np.full((1, 10, 4), 0.5, np.float32),
            "StatefulPartitionedCall:1": np.zeros((1, 20), np.float32),
            "StatefulPartitionedCall:2": np.full((1, 20), 0.9, np.float32),
            "StatefulPartitionedCall:3": np.array([10], np.float32)}
    return el.const_model(path, outs, size=(300, 300), layout="nhwc", dtype=np.uint8)


def _rtdetr_queries_apart(path: Path) -> Path:
    outs = {"labels": np.zeros((1, 300), np.int64), "boxes": np.zeros((1, 200, 4), np.float32),
            "scores": np.zeros((1, 300), np.float32)}
    return el.const_model(path, outs)


def _yolonas_rows_apart(path: Path) -> Path:
    outs = {"graph2_num_predictions": np.array([[1]], np.int64),
            "graph2_pred_boxes": np.zeros((1, 100, 4), np.float32),
            "graph2_pred_scores": np.zeros((1, 100), np.float32),
            "graph2_pred_classes": np.zeros((1, 50), np.int64)}
    return el.const_model(path, outs)


LOOKALIKES: dict[str, tuple[Callable[[Path], Path], dict[str, object], str]] = {
    "palm-18-wide": (_palm, {}, r"Closest: blazeface \(regressors 18 wide = 4 \+ 2 x 7 "
                                r"keypoints, where the MediaPipe face detector has 4 \+ 2 x 6"),
    "anchors-of-another-size": (_face_anchors_of_no_face_model, {},
                                r"Closest: blazeface \(2016 anchors at 192x192; .*896 at "
                                r"128x128, 896 at 256x256, 2304 at 192x192"),
    "labels-of-another-count": (_yolov5_of_80, {"labels": ["a", "b", "c"]},
                                r"Closest: .*yolov5 \(the labels .*have 3 classes, the outputs "
                                r"score 80"),
    "ssd-rows-apart": (_ssd_rows_apart, {"labels": "coco91"},
                       r"Closest: ssd \(boxes, classes and scores must have the same N rows"),
    "rtdetr-queries-apart": (_rtdetr_queries_apart, {},
                             r"Closest: rtdetr \(labels, boxes and scores must have the same Q"),
    "yolonas-rows-apart": (_yolonas_rows_apart, {},
                           r"Closest: .*yolo-nas \(pred_boxes, pred_scores and pred_classes must"),
}


@pytest.mark.parametrize("case", LOOKALIKES)
def test_auto_refuses_a_lookalike_naming_what_does_not_fit(case: str, tmp_path: Path) -> None:
    """Before: the palm detector decoded as faces (``face 1.00 [...]``), the others as the
    decoder they resemble, reading rows that do not belong together."""
    build, config, match = LOOKALIKES[case]
    message = _refusal(build(tmp_path / f"{case}.onnx"), **config)
    assert message.startswith("decoder: auto found no decoder"), message
    assert re.search(match, message), message


def test_auto_still_picks_the_real_models(blazeface_path: Path, person_path: Path,
                                          yolo_path: Path) -> None:
    face = samples.load_image("astronaut", _SAMPLES)
    for path, decoder, label in ((blazeface_path, "blazeface", "face"),
                                 (person_path, "blazepose", "person"),
                                 (yolo_path, "yolov8", None)):
        with edgeinfer.load_model(path, probe=False) as m:
            task = DetectTask(DetectConfig(score_threshold=0.5), m)
            assert task.decoder_choice[0] == decoder
            found = _detect(task, face)
        assert found, decoder
        assert label is None or found[0].label == label


def test_a_named_decoder_refuses_a_lookalike_too(tmp_path: Path) -> None:
    """``decoder: blazeface`` on the palm detector: refused at load, not read as faces."""
    message = _refusal(_palm(tmp_path / "palm.onnx"), decoder="blazeface")
    assert "regressors 18 wide" in message and "a MediaPipe detector of something else" in message


# --- a named decoder on the wrong head: the first frames' check ----------------------------------


def _picture(size: tuple[int, int] = el.FRAME) -> np.ndarray:
    return np.full((size[1], size[0], 3), 90, np.uint8)


def _detect(task: DetectTask, img: np.ndarray) -> list[Detection]:
    frame = Frame(index=0, ts=0.0, wall=0.0, data=img)
    feeds, tf = task.preprocess(frame)
    return list(task.postprocess(task.model.run(feeds), frame, tf).detections or ())


PERSON, CAR = (400.0, 200.0, 800.0, 600.0), (900.0, 380.0, 1200.0, 640.0)


def _yolox(size: int, big: bool = False) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        s = (size, size)
        dets = [el.Planted(el.to_input(PERSON, s, anchor="top-left"), 0, 0.9),
                el.Planted(el.to_input(CAR, s, anchor="top-left"), 2, 0.7)]
        if big:  # a box filling most of the input: log-sizes near 3, not thin as pixels
            dets = [el.Planted((10.0, 10.0, size - 10.0, size * 0.55), 0, 0.9)]
        return el.yolox_model(path, dets, size=s)
    return build


def _pixel_boxes_as_ssd(path: Path) -> Path:
    # SSD's four outputs and shapes, all float, holding pixel x1, y1, x2, y2 boxes (as
    # YOLO-NAS's renamed outputs do): a person at the input's top-left edge. Read as SSD's
    # fractions her box starts inside the input and runs hundreds of input sizes past it.
    boxes = np.zeros((1, 10, 4), np.float32)
    boxes[0, 0] = [0, 0, 300, 500]
    outs = {"StatefulPartitionedCall:0": boxes,
            "StatefulPartitionedCall:1": np.zeros((1, 10), np.float32),
            "StatefulPartitionedCall:2": np.array([[0.9] + [0] * 9], np.float32),
            "StatefulPartitionedCall:3": np.array([1], np.float32)}
    return el.const_model(path, outs, size=(640, 640))


def _end2end_pixels(path: Path) -> Path:
    boxes = np.array([el.to_input(PERSON, (640, 640))], np.float32)
    planted = ul.Planted(boxes, np.zeros(1, np.intp), np.array([0.9], np.float32))
    return ul.end2end_model(path, planted)


def _rtdetr_pairs(path: Path) -> Path:
    boxes = np.array([el.to_input(PERSON, (640, 640))], np.float32)
    planted = ul.Planted(boxes, np.zeros(1, np.intp), np.array([0.9], np.float32))
    return ul.rtdetr_model(path, planted, 80, pairs=True)


# (model, the wrong decoder, the right one where one reads it, what the refusal must name)
WRONG: dict[str, tuple[Callable[[Path], Path], str, str | None, str]] = {
    # one row per cell of the grid: YOLOX's offsets do not follow the cells, decoded boxes do
    "yolox-640-as-yolov5": (_yolox(640), "yolov5", "yolox",
                            r"do not follow their grid cells.*decoder: yolox"),
    "yolox-416-as-yolov5": (_yolox(416), "yolov5", "yolox",  # read as fractions: big boxes
                            r"do not follow their grid cells.*decoder: yolox"),
    # 600 x 600: YOLOX's floor(600 / s) cells are no YOLO grid, so the values decide
    "yolox-600-as-yolov5": (_yolox(600), "yolov5", "yolox",
                            r"under 2 px wide or tall.*decoder: yolox"),
    "yolox-600-big-box-as-yolov5": (_yolox(600, big=True), "yolov5", "yolox",
                                    r"within 6 px of the top-left corner.*decoder: yolox"),
    "pixel-boxes-as-ssd": (_pixel_boxes_as_ssd, "ssd", None,
                           r"more than 20 input sizes past the 640x640 input.*another unit"),
    "end2end-pixels-as-ultralytics-rtdetr": (_end2end_pixels, "ultralytics-rtdetr",
                                             "yolo-end2end", r"decoder: yolo-end2end"),
    "rtdetr-pairs-as-end2end": (_rtdetr_pairs, "yolo-end2end", "ultralytics-rtdetr",
                                r"x2 < x1.*decoder: ultralytics-rtdetr"),
}


@pytest.mark.parametrize("case", WRONG)
def test_a_wrong_decoder_is_refused_on_the_first_frame_naming_the_right_one(
        case: str, tmp_path: Path) -> None:
    """Before: YOLOX's raw head read by ``decoder: yolov5`` gave boxes like [0, 0, 1.4, 0] and
    no error; the same planted model read by the right decoder passes the same check."""
    build, wrong, right, match = WRONG[case]
    path = build(tmp_path / f"{case}.onnx")
    with edgeinfer.load_model(path, probe=False) as m:
        labels = "coco91" if wrong == "ssd" else "coco"
        task = DetectTask(DetectConfig(decoder=wrong, labels=labels, score_threshold=0.5), m)
        with pytest.raises(OutputLayoutError, match=f"(?s)decoder {wrong}: .*{match}"):
            _detect(task, _picture())
        if right is None:
            return
        task = DetectTask(DetectConfig(decoder=right, labels="coco", score_threshold=0.5), m)
        found = _detect(task, _picture())
    assert found and found[0].label == "person", found


def _pictures() -> list[tuple[str, np.ndarray]]:
    """Every sample picture as it is, turned a quarter, and cropped wide."""
    out = []
    for path in [samples.pull_sample("astronaut", _SAMPLES), *samples.sample_images(_SAMPLES)]:
        img = cv2.imread(str(path))
        h = img.shape[0]
        out += [(path.stem, img),
                (f"{path.stem}-turned", cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE)),
                (f"{path.stem}-wide", img[h // 4: h - h // 4])]
    return out


@pytest.mark.parametrize(("fixture", "decoder"), [("yolo_path", "yolov8"),
                                                  ("blazeface_path", "blazeface"),
                                                  ("person_path", "blazepose")])
def test_the_check_is_quiet_on_right_decoders_real_models_and_real_pictures(
        request: pytest.FixtureRequest, fixture: str, decoder: str) -> None:
    """Every sample picture (and turned, and cropped) at every threshold from 0.001: the
    check sees the candidates of each and refuses none."""
    path = request.getfixturevalue(fixture)
    shapes = {"images": (1, 3, 320, 320)} if decoder == "yolov8" else None
    checked = 0
    with edgeinfer.load_model(path, probe=False, input_shapes=shapes) as m:
        for threshold in (0.001, 0.05, 0.25, 0.5):
            task = DetectTask(DetectConfig(decoder=decoder, score_threshold=threshold), m)
            for _, img in _pictures():
                feeds, _ = task.preprocess(Frame(index=0, ts=0.0, wall=0.0, data=img))
                candidates = task.decoder(task.model.run(feeds), threshold)
                OutputCheck(task.decoder, task.labels)(candidates)  # raises if it refuses
                checked += len(candidates.scores) > 0
    assert checked >= 3 * 4, f"{checked} pictures had candidates: the test proves little"


# --- the refusal's length, and edgeinfer info's full account -------------------------------------


def test_the_refusal_leads_with_the_closest_layouts_and_the_fix(tmp_path: Path) -> None:
    """Before: about 2,500 characters, every decoder's expectations in turn."""
    yolox = _yolox(640)(tmp_path / "yolox.onnx")
    palm = _palm(tmp_path / "palm.onnx")
    flat = add_model(tmp_path / "flat.onnx", (1, 3, 32, 32), "images")
    for path, closest in ((yolox, r"Closest: yolov8 \(.*\); yolov5 \("),
                          (palm, r"Closest: blazeface \(.*\); blazepose \("),
                          (flat, r"none reads outputs of these ranks and count\. Is it a "
                                 r"detector\? Set task:")):
        message = _refusal(path)
        assert len(message) < 800, (len(message), message)
        assert re.search(closest, message), message
        assert message.endswith(f"every decoder's reason: edgeinfer info {path} --task detect")
        assert "decoder rfdetr expects" not in message  # the far ones are info's


def test_info_task_detect_gives_every_decoders_account(tmp_path: Path) -> None:
    palm = _palm(tmp_path / "palm.onnx")
    run = [sys.executable, "-m", "edgeinfer", "info", str(palm), "--no-probe", "--task", "detect"]
    done = subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 65, done.stderr
    task = json.loads(done.stdout)["task"]
    verdicts = {row["decoder"]: row["verdict"] for row in task["decoders"]}
    assert list(verdicts) == list(DECODERS)
    assert "regressors 18 wide" in verdicts["blazeface"]
    assert "18 wide = 4 + 2 x 7 keypoints" in verdicts["blazepose"]
    assert verdicts["yolov8"].startswith("decoder yolov8 expects one output")
    assert verdicts["dfine"] == "never picked by decoder: auto"
    done = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert done.returncode == 65, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("task detect   refused: decoder: auto") for line in lines)
    for name in DECODERS:
        assert any(line.startswith(f"  {name} ") for line in lines), (name, done.stdout)


def test_a_decoded_one_row_per_cell_head_still_reads_as_yolov5(tmp_path: Path) -> None:
    """The other side of YOLOX's case: a decoded anchor-free head (YOLOv6, YOLOv5 variants),
    every row's box at its own cell, is what ``decoder: yolov5`` reads there: no refusal."""
    size = (640, 640)
    cells = grid_centres(8400, size)
    assert cells is not None
    rng = np.random.default_rng(1)
    rows = np.zeros((8400, 85), np.float32)
    rows[:, :2] = cells + rng.normal(0, 3, cells.shape)
    rows[:, 2:4] = rng.uniform(8, 60, (8400, 2))
    rows[:, 4], rows[:, 5] = 0.01, 0.5
    person = el.to_input(PERSON, size)
    cx, cy = (person[0] + person[2]) / 2, (person[1] + person[3]) / 2
    at = int(np.argmin(np.hypot(*(cells - [cx, cy]).T)))  # the cell holding her centre
    rows[at, :6] = [cx, cy, person[2] - person[0], person[3] - person[1], 0.98, 0.0]
    rows[at, 5] = 0.95
    path = el.const_model(tmp_path / "yolov6.onnx", {"outputs": rows[None]}, size=size)
    with edgeinfer.load_model(path, probe=False) as m:
        task = DetectTask(DetectConfig(decoder="yolov5", labels="coco", score_threshold=0.5), m)
        found = _detect(task, _picture())
    assert [d.label for d in found] == ["person"]
    x1, y1, x2, y2 = found[0].box
    assert abs(x1 - PERSON[0]) < 2 and abs(y2 - PERSON[3]) < 2
