"""``detect:`` and ``motion:``: defaults by source, refusals that name the YAML path and the fix,
and the gate's decisions and crops on synthetic frames."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgeinfer.config import parse_config
from edgeinfer.config.motion import MotionConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Frame
from edgeinfer.pipeline.gate import DetectGate, crop_region


def _pipeline(source: str, extra: str = "", task: str = "{type: detect}") -> Any:
    text = f"""
pipelines:
  - name: p
    model: {{path: m.onnx}}
    source: {source}
    task: {task}
{extra}
"""
    return parse_config(text).pipelines[0]


@pytest.mark.parametrize(("source", "gate", "fps"), [
    ("{type: camera, uri: 'rtsp://cam/live'}", "motion", 5.0),
    ("{type: picamera2}", "motion", 5.0),
    ("{type: video, uri: v.mp4}", "always", None),
    ("{type: images, uri: pics}", "always", None),
    ("{type: synthetic}", "always", None),
])
def test_auto_gates_live_image_sources_and_runs_every_frame_of_files(
        source: str, gate: str, fps: float | None) -> None:
    pc = _pipeline(source)
    assert (pc.gate, pc.detect_fps) == (gate, fps)


def test_explicit_settings_win() -> None:
    assert _pipeline("{type: video, uri: v.mp4}", "    detect: {gate: motion}").gate == "motion"
    pc = _pipeline("{type: camera}", "    detect: {fps: null}")
    assert (pc.gate, pc.detect_fps) == ("motion", None)
    pc = _pipeline("{type: camera}", "    detect: {gate: always, fps: 2}")
    assert (pc.gate, pc.detect_fps) == ("always", 2.0)
    assert _pipeline("{type: audio, command: arecord}", task="{type: vad}").gate == "always"


@pytest.mark.parametrize(("source", "extra", "task", "where", "fix"), [
    ("{type: camera}", "    motion: {mask: [[[0, 0], [0.3, 0], [0.3, 0.1]], [[0, 0], [1.5, 0], "
     "[1, 1]]]}", "{type: detect}", "$.pipelines[0].motion", "mask[1]: point 1 (1.5, 0)"),
    ("{type: camera}", "    motion: {mask: [[[0, 0], [1, 0]]]}", "{type: detect}",
     "$.pipelines[0].motion.mask[0]", "length >= 3"),
    ("{type: camera}", "    motion: {mask: [[[0, 0], [1, 1], [1, 0], [0, 1]]]}",
     "{type: detect}", "$.pipelines[0].motion", "mask[0]: the mask polygon crosses itself"),
    ("{type: audio, command: arecord}", "    detect: {gate: motion}", "{type: vad}",
     "$.pipelines[0]", "use gate: always"),
    ("{type: serial, port: /dev/ttyS0}", "    detect: {gate: motion}", "{type: detect}",
     "$.pipelines[0]", "needs an image source"),
    ("{type: video, uri: v.mp4}", "    detect: {regions: true}", "{type: detect}",
     "$.pipelines[0]", "set detect.gate: motion, or regions: false"),
    ("{type: video, uri: v.mp4}", "    motion: {threshold: 40}", "{type: detect}",
     "$.pipelines[0]", "set detect.gate: motion, or remove motion:"),
    ("{type: camera}", "    detect: {regions: true}", "{type: classify}", "$.pipelines[0]",
     "needs a task that gives boxes"),
    ("{type: audio, command: arecord}", "    detect: {fps: 2}", "{type: vad}",
     "$.pipelines[0]", "remove detect.fps"),
])
def test_bad_gating_is_refused_with_its_path_and_the_fix(source: str, extra: str, task: str,
                                                         where: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        _pipeline(source, extra, task)
    message = str(info.value)
    assert f"{where}:" in message and fix in message, message


def _frame(i: int, image: np.ndarray, fps: float = 15.0) -> Frame:
    return Frame(index=i, ts=0.0, wall=0.0, data=image, start=i / fps)


def test_always_with_an_fps_runs_on_every_third_frame_of_15() -> None:
    gate = DetectGate("always", 5.0, 2.0, MotionConfig())
    image = np.zeros((48, 64, 3), dtype=np.uint8)
    runs = [i for i in range(30) if gate.decide(_frame(i, image)).detect]
    assert runs == list(range(0, 30, 3))


def test_motion_gate_runs_on_motion_at_its_fps_and_keeps_alive_otherwise() -> None:
    gate = DetectGate("motion", 5.0, 1.0, MotionConfig())
    still = np.full((120, 160, 3), 90, dtype=np.uint8)
    decisions = []
    for i in range(60):
        image = still.copy()
        if 20 <= i < 35:  # a square moves through frames 20..34
            x = 10 + 6 * (i - 20)
            image[40:80, x:x + 30] = 250
        decisions.append(gate.decide(_frame(i, image)))
    runs = [i for i, d in enumerate(decisions) if d.detect]
    rechecks = [i for i, d in enumerate(decisions) if d.recheck]
    # Motion is looked for at the model's rate, one frame in three (seen at 21, within one
    # interval of its start); the model runs on the first frame, keep-alives every 15 frames,
    # and while the square moves and as it leaves (the tracks' side is empty here: the emit
    # stage would report the square's track).
    assert runs == [0, 15, 21, 24, 27, 30, 33, 36, 51], runs
    assert rechecks == [0, 15, 51]
    assert all(len(decisions[i].motion) for i in runs[2:-1])
    assert not any(len(decisions[i].motion) for i in (20, 22, 23, 25, *range(37, 60)))
    assert gate.judged == 20
    gate.observe(np.array([[10.0, 10.0, 40.0, 40.0]]))  # a moving track: at the fps, no motion
    more = [gate.decide(_frame(i, still)).detect for i in range(60, 66)]
    assert more == [True, False, False, True, False, False]


def test_crop_region_is_the_union_with_a_margin_at_the_models_aspect_inside_the_frame() -> None:
    boxes = np.array([[100.0, 100.0, 150.0, 200.0], [160.0, 120.0, 180.0, 160.0]])
    x0, y0, x1, y1 = crop_region(boxes, 1280, 720, (320, 320))
    assert x0 <= 100 and y0 <= 100 and x1 >= 180 and y1 >= 200
    assert x1 - x0 >= 320 and y1 - y0 >= 320 and abs((x1 - x0) - (y1 - y0)) <= 2
    # Near the frame's corner: moved inside, not cut.
    x0, y0, x1, y1 = crop_region(np.array([[0.0, 0.0, 30.0, 30.0]]), 1280, 720, (320, 320))
    assert (x0, y0) == (0, 0) and x1 - x0 >= 320 and y1 - y0 >= 320
    # Far apart motion makes a crop over most of the frame: the whole frame.
    spread = np.array([[0.0, 0.0, 50.0, 50.0], [1200.0, 650.0, 1280.0, 720.0]])
    assert crop_region(spread, 1280, 720, (320, 320)) is None


def test_a_box_on_an_inner_crop_edge_is_told_from_one_on_the_frame_edge() -> None:
    gate = DetectGate("motion", 5.0, 2.0, MotionConfig(), regions=True, input_size=(128, 128))
    region = (0, 100, 300, 400)  # its left edge is the frame's
    inner = np.array([[250.0, 200.0, 299.5, 260.0]])
    on_frame_edge = np.array([[0.0, 200.0, 60.0, 260.0]])
    assert gate.touches_inner_edge(region, 640, 480, inner)
    assert not gate.touches_inner_edge(region, 640, 480, on_frame_edge)


def test_a_detection_cut_by_a_crop_edge_makes_the_next_detection_frame_whole() -> None:
    from edgeinfer.frames import DETECTIONS, Detection, TaskResult
    from edgeinfer.pipeline.gate import GateDecision
    from edgeinfer.pipeline.gated import GatedFrames

    gate = DetectGate("motion", 5.0, 2.0, MotionConfig(), regions=True, input_size=(128, 128))
    frames = GatedFrames(gate, None)
    image = np.zeros((480, 640, 3), dtype=np.uint8)
    frame = _frame(0, image)
    region = (100, 100, 400, 400)
    moving = np.array([[200.0, 200.0, 260.0, 260.0]])
    inside = TaskResult(DETECTIONS, (Detection("face", 0, 0.9, (200.0, 200.0, 260.0, 260.0)),))
    part, _ = frames.detected(frame, inside, GateDecision(True, region, moving))
    assert part is inside
    assert gate.crop_for(frame, moving, moving) is not None  # crops go on
    cut = TaskResult(DETECTIONS, (Detection("face", 0, 0.9, (350.0, 200.0, 399.5, 260.0)),))
    frames.detected(frame, cut, GateDecision(True, region, moving))
    assert gate.crop_for(frame, moving, moving) is None  # the whole frame, once
    assert gate.crop_for(frame, moving, moving) is not None
    # Untracked: skipped frames repeat the last detections, and the gate watches them.
    held, events = frames.skipped(_frame(1, image), GateDecision(False, None, moving))
    assert held is cut and events == []
