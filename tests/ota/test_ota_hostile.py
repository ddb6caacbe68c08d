"""A signed update whose metadata is a parse bomb (issue 31, item 6): refused, fast, never
committed, the running pipeline never stalled. Before, a 2 MB ``kpt_shape`` (a list of zeros)
was parsed 18 times per load: the update took 148 s, the other pipeline was silent 98 of them,
and it was committed."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.testing.export_layouts import Planted, pose_model, ultralytics_metadata
from rig import PREFIX, ROOT, Rig

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


# A pose decoder plug-in whose ``matches`` (run for ``decoder: auto`` while the task is built)
# loops or allocates when the model's metadata asks it to. It is loaded into every Python process
# of the device (the daemon, its workers) by a ``sitecustomize`` on ``PYTHONPATH``: edgeinfer has
# no plug-in loader of its own yet, and this way no hook in the package is needed.
_PLUGIN = '''
import time

from edgeinfer.tasks.decoders.base import Decoder


class HostileDecoder(Decoder):
    @classmethod
    def matches(cls, outputs, metadata):
        mode = metadata.get("hostile")
        if mode == "loop":  # bounded, so that the old code's daemon comes back at last
            end = time.monotonic() + 45
            while time.monotonic() < end:
                pass
        elif mode == "alloc":  # 4 GiB of address space, 32 MiB at a time (untouched pages)
            held = [bytearray(32 << 20) for _ in range(128)]
            del held
        return False
'''
_SITE = '''
from edgeinfer.tasks.pose import POSE_DECODERS
from edgeinfer.tasks.decoders import register_decoder

register_decoder("hostile", "hostile_decoder:HostileDecoder", POSE_DECODERS)
'''


def _plugin_env(tmp: Path) -> dict[str, str]:
    site = tmp / "site"
    site.mkdir()
    (site / "hostile_decoder.py").write_text(_PLUGIN)
    (site / "sitecustomize.py").write_text(_SITE)
    # this checkout first: sitecustomize imports edgeinfer before the working directory is on
    # sys.path, and would otherwise get whichever copy is installed
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(ROOT), str(site), *([path] if path else [])])}


def _gaps(results: list[dict[str, Any]]) -> float:
    stamps = sorted(float(r["ts"]) for r in results)
    return max((b - a for a, b in zip(stamps, stamps[1:])), default=float("inf"))


@pytest.mark.parametrize(("mode", "reason", "words", "limit_s"), [
    ("loop", "timeout", "longer than", 6),
    ("alloc", "out_of_memory", "limit of 256 MiB (ota.verify.memory_limit_mb)", 30),
])
def test_a_signed_update_whose_task_build_is_hostile_is_refused_in_the_worker(
        rig: Rig, tmp_path: Path, mode: str, reason: str, words: str, limit_s: float) -> None:
    good = _pose(tmp_path / "pose.onnx", "[17, 3]")
    meta = {**ultralytics_metadata("pose", ["person"], SIZE, kpt_shape="[17, 3]"),
            "hostile": mode}
    bad = pose_model(tmp_path / "pose-bad.onnx", PERSON, POINTS, size=SIZE, metadata=meta)
    dev = rig.device(good, task={"type": "pose"},
                     ota={"max_model_mb": 8,
                          "verify": {"memory_limit_mb": 256, "timeout_s": limit_s,
                                     "max_slowdown": 1000}})
    dev.start(env=_plugin_env(tmp_path))
    dev.wait_running()
    base = f"{PREFIX}/{dev.id}"
    rig.peer.drain(dev.result_topic)
    t0 = time.time()
    rig.push(bad, version=mode, base=base)
    status = dev.status(timeout=40)
    took = time.time() - t0
    assert status["state"] == "rejected" and status["reason"] == reason, (status, dev.tail())
    assert words in status["message"], status
    assert "task" in status["message"], status
    assert took < limit_s + 20, took
    # results kept flowing through the whole trial, on the running model
    results = [dev.result()] + [json.loads(m.payload) for m in rig.peer.drain(dev.result_topic)]
    latest = max(float(r["ts"]) for r in results)
    assert latest - t0 >= took - 1, (took, latest - t0)  # the window is covered to its end
    assert _gaps([r for r in results if float(r["ts"]) >= t0 - 1]) < 3.0, \
        sorted(float(r["ts"]) - t0 for r in results)
    assert not (dev.state / "ota" / "pipelines" / "cls" / "current").exists()
    assert dev.proc is not None and dev.proc.poll() is None
