"""Decode cost per frame (decode + NMS, + keypoints or masks) as a fraction of the model's own
inference time, at 320 and 640.

    python3 bench/decode.py [--runs 40] [--no-write]

The model is the catalog's real YOLOv8n export (``nudenet-320n``; its input is dynamic, so it
runs at 320 x 320 and 640 x 640) on the backend the selector picks, fed the astronaut
letterboxed from a 1280 x 720 frame. Its inference time is the denominator for all three
tasks. ``detect`` decodes that model's own outputs. ``pose`` and ``segment`` decode outputs of
the same shapes as Ultralytics' YOLO11n-pose / -seg exports at that size (built by
``edgeinfer.testing.export_layouts``, three people planted, each with a shifted copy NMS must
remove; segment: 32 prototypes at a quarter of the input) — no pose or segmentation model ships
in a wheel, and theirs cost more than the detector to infer, so the fraction shown is an upper
bound. Medians of ``--runs`` runs. Targets (issue 24): <= 10 % for detect and pose,
<= 25 % for segment.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PoseTask as PoseConfig
from edgeinfer.config.pipeline import SegmentTask as SegmentConfig
from edgeinfer.frames import Frame
from edgeinfer.model import catalog, samples
from edgeinfer.tasks import make_task
from edgeinfer.testing.export_layouts import (
    FRAME,
    Planted,
    pose_model,
    segment_model,
    to_input,
    ultralytics_metadata,
)

TARGETS = {"detect": 0.10, "pose": 0.10, "segment": 0.25}
PEOPLE = ((300.0, 120.0, 560.0, 680.0), (760.0, 200.0, 980.0, 610.0), (40.0, 300.0, 250.0, 700.0))


def _frame() -> Frame:
    image = samples.load_image("astronaut")
    canvas = np.full((FRAME[1], FRAME[0], 3), 40, np.uint8)
    side = FRAME[1]
    canvas[:, 200:200 + side] = cv2.resize(image, (side, side))
    return Frame(0, 0.0, 0.0, canvas)


def _median_ms(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _planted_model(kind: str, size: int, folder: Path) -> Path:
    dims = (size, size)
    dets = [Planted(to_input(b, dims), 0, s)
            for b, s in zip(PEOPLE, (0.91, 0.8, 0.72))]
    meta = ultralytics_metadata(kind, ["person"], dims,
                                **({"kpt_shape": "[17, 3]"} if kind == "pose" else {}))
    if kind == "pose":
        points = [np.column_stack([np.linspace(d.box[0], d.box[2], 17),
                                   np.linspace(d.box[1], d.box[3], 17), np.full(17, 0.9)])
                  for d in dets]
        return pose_model(folder / f"pose{size}.onnx", dets, points, size=dims, metadata=meta)
    return segment_model(folder / f"seg{size}.onnx", dets, size=dims, classes=1, metadata=meta)


def measure(runs: int) -> list[dict[str, Any]]:
    frame = _frame()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in (320, 640):
            with edgeinfer.load_model(catalog.pull("nudenet-320n"),
                                      input_shapes={"images": [1, 3, size, size]}) as model:
                task = make_task(DetectConfig(), model)
                feeds, ctx = task.preprocess(frame)
                outputs = model.run(feeds)
                infer = _median_ms(lambda m=model, x=feeds: m.run(x), runs)
                decode = _median_ms(lambda t=task, o=outputs, cx=ctx: t.postprocess(o, frame, cx),
                                    runs)
                rows.append({"task": "detect", "size": size, "pick": model.provider,
                             "infer_ms": infer, "decode_ms": decode})
                for kind, config in (("pose", PoseConfig()), ("segment", SegmentConfig())):
                    path = _planted_model(kind, size, Path(tmp))
                    with edgeinfer.load_model(path, probe=False) as planted:
                        other = make_task(config, planted)
                        f, c = other.preprocess(frame)
                        out = planted.run(f)
                        found = other.postprocess(out, frame, c).detections or ()
                        assert len(found) == len(PEOPLE), found  # the copies suppressed
                        ms = _median_ms(lambda o=other, x=out, cx=c: o.postprocess(x, frame, cx),
                                        runs)
                    rows.append({"task": kind, "size": size, "pick": model.provider,
                                 "infer_ms": infer, "decode_ms": ms})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| task | input | inference on the pick, ms | decode + NMS (+ keypoints / masks), ms "
           "| fraction | target |", "|---|---|---|---|---|---|"]
    for r in rows:
        frac = r["decode_ms"] / r["infer_ms"]
        target = TARGETS[r["task"]]
        mark = "" if frac <= target else " **missed**"
        out.append(f"| {r['task']} | {r['size']} x {r['size']} | {r['infer_ms']:.2f} "
                   f"({r['pick']}) | {r['decode_ms']:.3f} | {frac:.1%}{mark} | <= {target:.0%} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = measure(args.runs)
    body = (__doc__.split("\n\n", 2)[2].strip() + "\n\n" + table(rows) + "\n\n" + machine_facts())
    print(body)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "decode",
                      "Decoding cost per frame (detect, pose, segment)", body,
                      "python3 bench/decode.py")


if __name__ == "__main__":
    main()
