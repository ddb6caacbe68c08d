"""Per-frame cost of scene analytics: the tracker alone, then tracker + zones + lines.

    python3 bench/analytics_cost.py [--frames 600] [--seed 0] [--json]

Objects move on straight lines with jittered boxes over a 1920x1080 frame (seeded); each
frame is tracked (``ByteTracker`` with ``TrackConfig()``) and, where the module exists, fed to
``edgeinfer.analytics.scene.Scene`` with 2 zones and 2 lines. The first 50 frames (tracks
being born) are not timed; mean and p99 per frame are in milliseconds. The budget is 0.5 ms
per frame for tracker + zones + lines, 0.25 ms for the tracker with 50 objects.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgeinfer.analytics.tracker import ByteTracker
from edgeinfer.config.analytics import LineConfig, TrackConfig, ZoneConfig

WIDTH, HEIGHT = 1920, 1080
WARMUP = 50


def scene_frames(n: int, frames: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``frames`` x (boxes, scores) of ``n`` objects that bounce around the frame."""
    rng = np.random.default_rng(seed)
    size = rng.uniform(30, 90, (n, 1)) * np.array([[1.0, 2.0]])
    pos = rng.uniform(0, 1, (n, 2)) * (np.array([WIDTH, HEIGHT]) - size)
    vel = rng.uniform(-6, 6, (n, 2))
    out = []
    for _ in range(frames):
        pos += vel
        bounce = (pos < 0) | (pos + size > [WIDTH, HEIGHT])
        vel[bounce] *= -1
        boxes = np.hstack([pos, pos + size]) + rng.normal(0, 1.5, (n, 4))
        scores = np.where(rng.random(n) < 0.1, rng.uniform(0.2, 0.5, n), rng.uniform(0.6, 0.95, n))
        out.append((boxes, scores))
    return out


def _stats(times: list[float]) -> dict[str, float]:
    ms = np.array(times[WARMUP:]) * 1e3
    return {"mean_ms": round(float(ms.mean()), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4)}


def time_tracker(data: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    tracker = ByteTracker(TrackConfig())
    classes = np.zeros(len(data[0][1]), dtype=np.int64)
    times = []
    for boxes, scores in data:
        t0 = time.perf_counter()
        tracker.update(boxes, scores, classes)
        times.append(time.perf_counter() - t0)
    return {**_stats(times), "active_tracks": tracker.active}


def scene_zones() -> list[ZoneConfig]:
    return [ZoneConfig(name="left", points=[[0.05, 0.1], [0.45, 0.1], [0.45, 0.9], [0.05, 0.9]]),
            ZoneConfig(name="tri", points=[[0.5, 0.2], [0.95, 0.5], [0.5, 0.9]])]


def scene_lines() -> list[LineConfig]:
    return [LineConfig(name="mid", points=[[0.5, 0.0], [0.5, 1.0]]),
            LineConfig(name="row", points=[[0.0, 0.6], [1.0, 0.6]])]


def _make_scene() -> Any:
    from edgeinfer.analytics.scene import Scene

    scene = Scene(scene_zones(), scene_lines(), class_names=["person"])
    scene.bind(WIDTH, HEIGHT)
    return scene


def time_tracker_and_scene(data: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    tracker = ByteTracker(TrackConfig())
    scene = _make_scene()
    n = len(data[0][1])
    classes = np.zeros(n, dtype=np.int64)
    labels = ["person"] * n
    times, events = [], 0
    for frame, (boxes, scores) in enumerate(data):
        t0 = time.perf_counter()
        up = tracker.update(boxes, scores, classes)
        found = scene.update(frame / 30.0, 1.7e9 + frame / 30.0, frame, up.ids, boxes, classes,
                             scores, labels, up.ended)
        times.append(time.perf_counter() - t0)
        events += len(found)
    return {**_stats(times), "events": events}


def time_stage(data: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """What the pipeline's emit thread runs per frame: `SceneAnalytics.process` on a detect
    result (detections as objects in, tracked ones out, tracker, zones and lines, events as
    dicts), without event media."""
    import tempfile
    from pathlib import Path

    from edgeinfer.analytics.stage import SceneAnalytics
    from edgeinfer.config import ModelConfig, PipelineConfig
    from edgeinfer.config.pipeline import DetectTask, SyntheticSource
    from edgeinfer.frames import Detection, Frame, TaskResult

    pc = PipelineConfig(name="p", model=ModelConfig(path="m.onnx"),
                        source=SyntheticSource(), task=DetectTask(decoder="yolov8"),
                        zones=scene_zones(), lines=scene_lines())
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    times, events = [], 0
    with tempfile.TemporaryDirectory() as state:
        stage = SceneAnalytics(pc, class_names=["person"], state_dir=Path(state))
        for frame, (boxes, scores) in enumerate(data):
            dets = tuple(Detection("person", 0, float(s), (float(b[0]), float(b[1]), float(b[2]),
                                                          float(b[3])))
                         for b, s in zip(boxes, scores, strict=True))
            f = Frame(frame, frame / 30.0, 1.7e9 + frame / 30.0, image)
            t0 = time.perf_counter()
            _, found = stage.process(f, TaskResult(detections=dets))
            times.append(time.perf_counter() - t0)
            events += len(found)
        stage.close()
    return {**_stats(times), "events": events}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    result: dict[str, Any] = {"seed": args.seed, "frames": args.frames, "timed_from": WARMUP,
                              "tracker": {}, "tracker+scene": {}, "stage": {}}
    try:
        _make_scene()
    except ImportError as exc:
        result["tracker+scene"] = None
        result["note"] = f"edgeinfer.analytics.scene not importable ({exc}): scene part skipped"
    for n in (10, 50, 100):
        data = scene_frames(n, args.frames, args.seed)
        result["tracker"][n] = time_tracker(data)
        if result["tracker+scene"] is not None:
            result["tracker+scene"][n] = time_tracker_and_scene(data)
            result["stage"][n] = time_stage(data)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"per-frame cost, ms (seed {args.seed}, {args.frames} frames, first {WARMUP} untimed)")
    for n in (10, 50, 100):
        t = result["tracker"][n]
        line = f"{n:4d} objects: tracker mean {t['mean_ms']:.3f} p99 {t['p99_ms']:.3f}"
        if result["tracker+scene"] is not None:
            s = result["tracker+scene"][n]
            line += f" | tracker+scene mean {s['mean_ms']:.3f} p99 {s['p99_ms']:.3f}"
            g = result["stage"][n]
            line += f" | SceneAnalytics.process mean {g['mean_ms']:.3f} p99 {g['p99_ms']:.3f}"
        print(line)
    if "note" in result:
        print(result["note"])


if __name__ == "__main__":
    main()
