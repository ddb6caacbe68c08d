"""Pipeline benchmark: the threaded pipeline against a raw session loop and a naive loop.

    python3 bench/pipeline.py [--frames 300] [--soak 10000] [--no-write]

One video file (640x480, made from a real photograph) goes through
decode -> letterbox -> YOLOv8n-320 -> decode + NMS -> jsonl, three ways, same threads:

- raw: ``InferenceSession.run`` over tensors prepared beforehand (the model's own speed);
- naive: one thread doing read, preprocess, run, postprocess, write for each frame;
- pipeline: ``edgeinfer.Pipeline`` (capture/preprocess, inference and postprocess/emit overlap).

The three are run in rotation, ``--repeats`` times, and compared by median frames per second.
Then a soak: ``--soak`` frames of a looping source through the pipeline while resident memory
is sampled; the slope of a least-squares line says whether memory stays flat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

THREADS = 1  # --threads; with 2 cores, one for the model and one for capture/pre/post
SIZE = (320, 320)
FRAME = (1280, 720)  # --frame-size; a 720p camera


def make_video(path: Path, frames: int) -> Path:
    from edgeinfer import samples

    return samples.demo_video(path, frames=frames, size=FRAME)


def pipeline_config(video: Path, out: Path, loop: bool = False):  # type: ignore[no-untyped-def]
    from edgeinfer.config import parse_config

    return parse_config(json.dumps({
        "pipelines": [{
            "name": "bench",
            "source": {"type": "video", "uri": str(video), "loop": loop},
            "model": {"path": "nudenet-320n", "threads": THREADS},
            "task": {"type": "detect", "decoder": "yolov8", "score_threshold": 0.25,
                     "preprocess": {"size": list(SIZE)}},
            "sinks": [{"type": "jsonl", "path": str(out)}],
        }]
    }))


def run_pipeline(config) -> float:  # type: ignore[no-untyped-def]
    from edgeinfer.pipeline import Pipeline

    p = Pipeline.from_config(config)
    t = time.perf_counter()
    p.run()
    return p.stats.processed / (time.perf_counter() - t)


def run_naive(config) -> float:  # type: ignore[no-untyped-def]
    """Everything in one thread, with the same parts the pipeline uses."""
    from edgeinfer.pipeline.build import load_pipeline_model
    from edgeinfer.frames import ModelRef, Result
    from edgeinfer.sinks import make_sink
    from edgeinfer.sources import open_source
    from edgeinfer.tasks import make_task

    pc = config.pipelines[0]
    model = load_pipeline_model(pc, config.runtime)
    task = make_task(pc.task, model)
    sink = make_sink(pc.sinks[0])
    ref = ModelRef(model.name, model.version, model.sha256)
    n = 0
    t = time.perf_counter()
    with open_source(pc.source) as source, sink:
        for frame in source:
            feeds, ctx = task.preprocess(frame)
            part = task.postprocess(model.run(feeds), frame, ctx)
            n += 1
            sink.write(Result(n, time.time(), "naive", frame, ref, model.provider,
                              (0.0, 0.0, 0.0), part))
    fps = n / (time.perf_counter() - t)
    model.close()
    return fps


def run_raw(config, frames: int) -> float:  # type: ignore[no-untyped-def]
    """The model alone: session.run over tensors preprocessed beforehand."""
    import onnxruntime as ort

    from edgeinfer.pipeline.build import load_pipeline_model
    from edgeinfer.runtime.backends import onnx as backend
    from edgeinfer.runtime.base import SessionSpec
    from edgeinfer.sources import open_source
    from edgeinfer.tasks import make_task

    pc = config.pipelines[0]
    model = load_pipeline_model(pc, config.runtime)
    task = make_task(pc.task, model)
    with open_source(pc.source) as source:
        tensors = [task.preprocess(f)[0]["images"] for f in source]
    model.close()
    spec = SessionSpec(path=Path(model.path), format="onnx", sha256="", threads=THREADS,
                       options={"onnxruntime": backend.OnnxOptions("default")})
    so = backend.session_options(ort, spec, "CPUExecutionProvider")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    for dim, value in (("batch", 1), ("height", SIZE[1]), ("width", SIZE[0])):
        so.add_free_dimension_override_by_name(dim, value)
    sess = ort.InferenceSession(str(model.path), so, providers=["CPUExecutionProvider"])
    sess.run(None, {"images": tensors[0]})
    t = time.perf_counter()
    for x in tensors:
        sess.run(None, {"images": x})
    return len(tensors) / (time.perf_counter() - t)


def soak(video: Path, out: Path, frames: int) -> dict[str, float]:
    """Resident memory sampled while ``frames`` frames go through a looping pipeline."""
    import numpy as np

    from edgeinfer.pipeline import Pipeline
    from edgeinfer.runtime.memory import rss_mb

    samples: list[tuple[int, float]] = []

    def on_result(result) -> None:  # type: ignore[no-untyped-def]
        if result.seq % 250 == 0:
            samples.append((result.seq, rss_mb()))
            if result.seq >= frames:
                p.stop()

    p = Pipeline.from_config(pipeline_config(video, out, loop=True), on_result=on_result)
    t = time.perf_counter()
    p.run()
    elapsed = time.perf_counter() - t
    xs = np.array([s[0] for s in samples], dtype=float)
    ys = np.array([s[1] for s in samples], dtype=float)
    steady = xs >= xs.max() * 0.2  # after warm-up: caches and arenas filled
    slope = float(np.polyfit(xs[steady], ys[steady], 1)[0]) * 1000 if steady.sum() > 2 else 0.0
    return {"frames": float(p.stats.processed), "seconds": elapsed,
            "rss_start_mb": float(ys[steady][0]), "rss_end_mb": float(ys[-1]),
            "slope_mb_per_1000": slope}


def main() -> int:
    global THREADS, FRAME
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--soak", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=THREADS, help="intra-op threads, all loops")
    parser.add_argument("--frame-size", default="x".join(map(str, FRAME)), metavar="WxH")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    THREADS = args.threads
    FRAME = tuple(int(v) for v in args.frame_size.split("x"))  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as tmp:
        video = make_video(Path(tmp) / "bench.avi", args.frames)
        out = Path(tmp) / "out.jsonl"
        config = pipeline_config(video, out)
        fps: dict[str, list[float]] = {"raw": [], "naive": [], "pipeline": []}
        for _ in range(args.repeats):
            fps["raw"].append(run_raw(config, args.frames))
            fps["naive"].append(run_naive(config))
            fps["pipeline"].append(run_pipeline(config))
        med = {k: statistics.median(v) for k, v in fps.items()}
        memory = soak(video, out, args.soak) if args.soak else None
    text = render(med, memory, args)
    print(text)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", f"pipeline-t{THREADS}",
                      f"Pipeline, {THREADS} inference thread(s)", text,
                      f"python3 bench/pipeline.py --frames {args.frames} --soak {args.soak} "
                      f"--threads {THREADS} --frame-size {args.frame_size}")
    return 0


def render(med: dict[str, float], memory: dict[str, float] | None,
           args: argparse.Namespace) -> str:
    lines = [
        f"A {args.frames}-frame {FRAME[0]}x{FRAME[1]} video (made from a photograph) through decode -> "
        f"letterbox -> YOLOv8n-320 -> decode + NMS -> jsonl, {THREADS} threads, CPU provider; "
        f"median of {args.repeats} rotated runs. {machine_facts()}",
        "",
        "| measure | frames/s | ratio | target |",
        "|---|---|---|---|",
        f"| raw `session.run` over pre-made tensors | {med['raw']:.1f} | 1.00 | |",
        f"| naive sequential loop (read, preprocess, run, postprocess, write) | "
        f"{med['naive']:.1f} | {med['naive'] / med['raw']:.2f} x raw | |",
        f"| edgeinfer pipeline (end to end) | {med['pipeline']:.1f} | "
        f"{med['pipeline'] / med['raw']:.2f} x raw, {med['pipeline'] / med['naive']:.2f} x naive "
        f"| >= 0.90 x raw, >= 1.2 x naive |",
    ]
    if memory:
        lines += [
            "",
            f"Soak: {memory['frames']:.0f} frames in {memory['seconds']:.0f} s; resident memory "
            f"{memory['rss_start_mb']:.1f} MiB after warm-up, {memory['rss_end_mb']:.1f} MiB at "
            f"the end; least-squares slope {memory['slope_mb_per_1000']:+.3f} MiB per 1000 "
            "frames (flat: bounded queues, no per-frame growth).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
