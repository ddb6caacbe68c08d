"""``detect_uri`` end to end: a camera's main stream and substream (the same scene, pre-encoded
H.264 files served looping by GStreamer's RTSP server), the PyAV camera decoding only the
substream, and a real detector (``testing.detector_models``: it finds red squares) whose boxes
come out in main-stream pixels; the annotated snapshot is the substream frame."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PreprocessConfig
from edgeinfer.frames import Frame
from edgeinfer.pipeline.tuning import annotate
from edgeinfer.sources import open_source
from edgeinfer.tasks import make_task
from edgeinfer.testing.detector_models import conv_detector_model
from edgeinfer.testing.streams import APT_PACKAGES, RtspServer, rtsp_available, write_h264

pytest.importorskip("av", reason="PyAV is not installed (pip install 'edgeinfer[rtsp]')")

MAIN, SUB = (256, 192), (128, 96)
SQUARE = (64, 32, 192, 160)  # x1, y1, x2, y2 in main-stream pixels


def _scene(size: tuple[int, int]) -> np.ndarray:
    w, h = size
    f = w / MAIN[0]
    img = np.full((h, w, 3), 15, np.uint8)
    x1, y1, x2, y2 = (round(v * f) for v in SQUARE)
    img[y1:y2, x1:x2] = (0, 0, 230)  # BGR red: the detector's class 0
    return img


@pytest.fixture(scope="module")
def camera(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RtspServer]:
    why = rtsp_available(codec="file")
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")
    folder = tmp_path_factory.mktemp("substream")
    main = write_h264(folder / "main.mp4", [_scene(MAIN)] * 15, fps=15)
    sub = write_h264(folder / "sub.mp4", [_scene(SUB)] * 15, fps=15)
    with RtspServer(file=main, sub_file=sub) as server:
        yield server


def _frames(url: str, detect_url: str, n: int) -> list[Frame]:
    source = open_source(CameraConfig(uri=url, detect_uri=detect_url, open_timeout_s=5))
    got: list[Frame] = []
    watchdog = threading.Timer(20, source.stop)
    watchdog.start()
    try:
        with source:
            for frame in source:
                got.append(frame)
                if len(got) == n:
                    break
    finally:
        watchdog.cancel()
    assert len(got) == n, f"{len(got)} frames"
    return got


def test_boxes_from_the_substream_come_out_in_main_stream_pixels(camera: RtspServer,
                                                                  tmp_path: Path) -> None:
    frames = _frames(camera.url, camera.sub_url, 3)
    frame = frames[-1]
    assert frame.data.shape == (SUB[1], SUB[0], 3) and frame.display == MAIN
    model_path = conv_detector_model(tmp_path / "det.onnx", size=64)
    with edgeinfer.load_model(model_path) as model:
        task = make_task(DetectConfig(decoder="yolov8", labels=["red", "green"],
                                      preprocess=PreprocessConfig(size=[64, 64])), model)
        feeds, transform = task.preprocess(frame)
        part = task.postprocess(model.run(feeds), frame, transform)
        # The same picture without its display size: boxes in the substream's pixels.
        plain = Frame(frame.index, frame.ts, frame.wall, frame.data)
        feeds, transform = task.preprocess(plain)
        small = task.postprocess(model.run(feeds), plain, transform)
    dets = [d for d in part.detections or () if d.label == "red"]
    assert dets, part
    union = (min(d.box[0] for d in dets), min(d.box[1] for d in dets),
             max(d.box[2] for d in dets), max(d.box[3] for d in dets))
    # Main-stream pixels: centred on the square (its cells' boxes reach half a cell past it).
    centre = ((union[0] + union[2]) / 2, (union[1] + union[3]) / 2)
    assert np.allclose(centre, ((SQUARE[0] + SQUARE[2]) / 2, (SQUARE[1] + SQUARE[3]) / 2),
                       atol=4), union
    assert SQUARE[2] - SQUARE[0] <= union[2] - union[0] <= SQUARE[2] - SQUARE[0] + 48, union
    small_dets = [d for d in small.detections or () if d.label == "red"]
    small_union = (min(d.box[0] for d in small_dets), min(d.box[1] for d in small_dets),
                   max(d.box[2] for d in small_dets), max(d.box[3] for d in small_dets))
    assert np.allclose(np.array(small_union) * 2, union, atol=1e-6)
    # The snapshot is the substream frame, its boxes drawn scaled down onto it.
    jpeg = annotate(frame, part)
    shown = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert shown.shape == (SUB[1], SUB[0], 3)
    # Drawn as the substream's own detections would be: the same picture.
    same = cv2.imdecode(np.frombuffer(annotate(plain, small), np.uint8), cv2.IMREAD_COLOR)
    assert np.abs(shown.astype(int) - same).max() <= 2
    assert np.abs(shown.astype(int) - frame.data).max() > 100  # and boxes were drawn
