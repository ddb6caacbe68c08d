"""A signed update whose metadata is a parse bomb (issue 31, item 6): refused, fast, never
committed, the running pipeline never stalled. Before, a 2 MB ``kpt_shape`` (a list of zeros)
was parsed 18 times per load: the update took 148 s, the other pipeline was silent 98 of them,
and it was committed."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from edgeinfer.testing.export_layouts import Planted, pose_model, ultralytics_metadata
from rig import PREFIX, Rig

SIZE = (64, 64)
POINTS = [np.tile(np.array([[20.0, 20.0, 0.9]], np.float32), (17, 1))]
PERSON = [Planted((10.0, 10.0, 40.0, 50.0), 0, 0.9)]


def _pose(path: Path, kpt_shape: str) -> Path:
    meta = ultralytics_metadata("pose", ["person"], SIZE, kpt_shape=kpt_shape)
    return pose_model(path, PERSON, POINTS, size=SIZE, metadata=meta)


def test_a_signed_update_with_a_2mb_kpt_shape_is_refused_and_never_committed(
        rig: Rig, tmp_path: Path) -> None:
    good = _pose(tmp_path / "pose.onnx", "[17, 3]")
    bomb = _pose(tmp_path / "pose-bomb.onnx", "[" + "0, " * 700_000 + "0]")  # 2.1 MB
    dev = rig.device(good, task={"type": "pose"}, ota={"max_model_mb": 8}).start()
    dev.wait_running()
    base = f"{PREFIX}/{dev.id}"
    before = dev.result()["seq"]
    t0 = time.monotonic()
    rig.push(bomb, version="bomb", base=base)
    status = dev.status()
    took = time.monotonic() - t0
    assert status["state"] == "rejected" and status["reason"] == "undecodable", \
        (status, dev.tail())
    assert "metadata 'kpt_shape' is 2,100,003 characters long" in status["message"], status
    assert took < 30, took  # the transfer and a worker's load; the parse itself is refused unread
    # the running pipeline went on, on its own model, and nothing was installed
    assert dev.result()["seq"] > before
    assert not (dev.state / "ota" / "pipelines" / "cls" / "current").exists()
    assert dev.proc is not None and dev.proc.poll() is None
