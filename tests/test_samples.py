"""Sample assets: the astronaut photograph from scikit-image's wheel, and the demo clip."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

import edgeinfer
from edgeinfer import samples
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.errors import ModelFetchError
from edgeinfer.frames import Frame
from edgeinfer.model import Model
from edgeinfer.runtime.modelfile import file_sha256
from edgeinfer.tasks.detect import DetectTask

_SAMPLES = samples.samples_dir()  # read before conftest points the cache at a temporary dir


@pytest.fixture(scope="session")
def astronaut_path() -> Path:
    try:
        return samples.pull_sample("astronaut", _SAMPLES)
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"sample image unavailable: {exc}")


@pytest.fixture(scope="module")
def blazeface(blazeface_path: Path) -> Iterator[Model]:
    with edgeinfer.load_model(blazeface_path) as m:
        yield m


def test_astronaut_is_pinned_and_cached(astronaut_path: Path) -> None:
    entry = samples.SAMPLES["astronaut"]
    assert file_sha256(astronaut_path) == entry.sha256
    assert astronaut_path == samples.sample_path("astronaut", _SAMPLES)
    before = astronaut_path.stat().st_mtime_ns
    assert samples.pull_sample("astronaut", _SAMPLES) == astronaut_path  # reused, not fetched
    assert astronaut_path.stat().st_mtime_ns == before
    image = samples.load_image("astronaut", _SAMPLES)
    assert image.shape == (512, 512, 3) and image.dtype == np.uint8


def test_unknown_sample() -> None:
    with pytest.raises(ModelFetchError, match="unknown sample 'nope'; known: astronaut"):
        samples.pull_sample("nope")


def test_samples_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                                             ) -> None:
    monkeypatch.setenv("EDGEINFER_SAMPLES", str(tmp_path))
    assert samples.sample_path() == tmp_path / "astronaut.png"
    clip = samples.demo_video(frames=3, image=np.zeros((64, 64, 3), np.uint8))
    assert clip == tmp_path / "demo.mp4" and clip.stat().st_size > 0


@pytest.mark.parametrize("suffix", [".mp4", ".avi"])
def test_demo_video_pans_over_the_face(astronaut_path: Path, blazeface: Model, tmp_path: Path,
                                       suffix: str) -> None:
    image = cv2.imread(str(astronaut_path))
    path = samples.demo_video(tmp_path / f"demo{suffix}", frames=24, fps=15, image=image)
    cap = cv2.VideoCapture(str(path))
    try:
        assert cap.get(cv2.CAP_PROP_FPS) == pytest.approx(15)
        frames = []
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(frame)
    finally:
        cap.release()
    assert len(frames) == 24 and frames[0].shape == (480, 640, 3)
    task = DetectTask(DetectConfig(decoder="blazeface", score_threshold=0.6), blazeface)
    boxes = []
    for i, data in enumerate(frames):
        frame = Frame(i, 0.0, 0.0, data)
        feeds, tf = task.preprocess(frame)
        dets = task.postprocess(blazeface.run(feeds), frame, tf).detections
        assert dets is not None and len(dets) == 1, f"frame {i}: {dets}"
        boxes.append(dets[0].box)
    b = np.array(boxes)
    assert np.ptp(b[:, 0]) > 60  # it moves
    assert np.ptp(b[:, 2] - b[:, 0]) > 20  # and zooms
    assert (b[:, 1] > 0).all()  # the face stays whole in the frame
