"""Shared model benchmark: resident memory of 1 and 4 camera pipelines on one model, with a
session per pipeline (before) and one session shared by all (after).

    python3 bench/shared.py [--frames 100] [--cameras 4] [--fps 15] [--threads N]

Each case runs in a fresh Python process: live synthetic cameras (``--size``, ``--fps``, frames
dropped oldest-first when inference falls behind, as a real camera's are) -> YOLOv8n-320 ->
decode + NMS, no sinks. When every pipeline has processed ``--frames`` frames, the process's
resident memory is read (and its peak), with each camera's frames per second, the frames its
queue dropped and its median wait for the shared model. "Before" is the same code with the
process's model pool switched off (``edgeinfer.model.pool.model_pool().enabled = False``): each
pipeline loads its own session, arena and thread pool, as edgeinfer did before sharing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def config_text(cameras: int, fps: float, size: tuple[int, int], threads: int | None,
                queue_size: int = 2) -> str:
    model: dict[str, Any] = {"path": "nudenet-320n"}
    if threads:
        model["threads"] = threads
    return json.dumps({"pipelines": [{
        "name": f"cam{i}",
        "source": {"type": "synthetic", "width": size[0], "height": size[1], "fps": fps},
        "model": model,
        "task": {"type": "detect", "decoder": "yolov8", "score_threshold": 0.25,
                 "preprocess": {"size": [320, 320]}},
        "sinks": [],
        "queue_size": queue_size,
    } for i in range(cameras)]})


def child(args: argparse.Namespace) -> int:
    """One case, in this process; prints its JSON line."""
    import cv2  # noqa: F401  (the libraries every case loads count in the baseline)
    import onnxruntime  # noqa: F401

    from edgeinfer.config import parse_config
    from edgeinfer.pipeline import Pipeline
    from edgeinfer.runtime.memory import peak_rss_mb, return_frames_to_the_os, rss_mb
    from edgeinfer.model.pool import model_pool

    return_frames_to_the_os()  # as the daemon does at start
    model_pool().enabled = args.share
    config = parse_config(config_text(args.cameras, args.fps, _size(args.size), args.threads,
                                      args.queue_size))
    base = rss_mb()
    pipes = [Pipeline.from_config(config, name=pc.name) for pc in config.pipelines]
    loaded = rss_mb()
    for p in pipes:
        p.start()
    t0 = time.monotonic()
    deadline = t0 + args.timeout
    while min(p.stats.processed for p in pipes) < args.frames:
        if time.monotonic() > deadline:
            print(json.dumps({"error": "timed out"}))
            return 1
        time.sleep(0.05)
    elapsed = time.monotonic() - t0
    snaps = [p.snapshot() for p in pipes]
    rss, peak = rss_mb(), peak_rss_mb()
    sessions = len(model_pool()) if args.share else len(pipes)
    for p in pipes:
        p.close()
    print(json.dumps({
        "base_mb": base, "loaded_mb": loaded, "rss_mb": rss, "peak_mb": peak,
        "sessions": sessions, "elapsed_s": elapsed,
        "cameras": [{"name": s["pipeline"], "fps": s["processed"] / elapsed,
                     "processed": s["processed"], "dropped": s["dropped"]["queue"],
                     "wait_p50_ms": s["latency_ms"]["wait"]["p50"],
                     "infer_p50_ms": s["latency_ms"]["infer"]["p50"]} for s in snaps],
    }))
    return 0


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose RSS is the median, with each camera's median fps, drops and wait."""
    ordered = sorted(runs, key=lambda r: r["rss_mb"])
    out = dict(ordered[len(ordered) // 2])
    out["cameras"] = [
        {"name": cams[0]["name"],
         **{k: statistics.median(c[k] for c in cams)
            for k in ("fps", "dropped", "wait_p50_ms", "infer_p50_ms")}}
        for cams in zip(*(r["cameras"] for r in runs), strict=True)]
    return out


def _size(text: str) -> tuple[int, int]:
    w, h = (int(v) for v in text.lower().split("x"))
    return w, h


def run_case(args: argparse.Namespace, cameras: int, share: bool, env: dict[str, str]
             ) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--cameras", str(cameras),
           "--frames", str(args.frames), "--fps", str(args.fps), "--size", args.size,
           "--timeout", str(args.timeout), "--queue-size", str(args.queue_size)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if share:
        cmd.append("--share")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=args.timeout + 120)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"case cameras={cameras} share={share} failed:\n{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def render(cases: dict[tuple[str, int], dict[str, Any]], cameras: int,
           args: argparse.Namespace) -> str:
    from _report import machine_facts

    rows = ["| case | cameras | sessions | RSS MiB | over start MiB | peak MiB | RSS / 1 camera "
            "| per camera: fps, dropped, wait p50 ms |", "|---|---|---|---|---|---|---|---|"]
    for mode in ("before", "after"):
        one = cases[(mode, 1)]["rss_mb"]
        for n in (1, cameras):
            c = cases[(mode, n)]
            per = "; ".join(f"{k['name']} {k['fps']:.1f}, {k['dropped']:.0f}, "
                            f"{k['wait_p50_ms']:.1f}"
                            for k in c["cameras"])
            rows.append(f"| {mode} ({'shared session' if mode == 'after' else 'session each'}) "
                        f"| {n} | {c['sessions']} | {c['rss_mb']:.0f} | "
                        f"{c['rss_mb'] - c['base_mb']:.0f} | {c['peak_mb']:.0f} | "
                        f"{c['rss_mb'] / one:.2f}x | {per} |")
    before, after = cases[("before", cameras)]["rss_mb"], cases[("after", cameras)]["rss_mb"]
    threads = args.threads or "default"
    return "\n".join([
        f"YOLOv8n-320, live synthetic cameras {args.size} at {args.fps:g} fps each, "
        f"{threads} inference threads, queue_size {args.queue_size}, RSS read after every "
        f"camera processed {args.frames} frames; each case a fresh process, {args.repeats} runs "
        "in rotation, medians (\"over start\": RSS minus the process's RSS before "
        "the first pipeline, with Python, numpy, OpenCV and onnxruntime imported).",
        "",
        *rows,
        "",
        f"{cameras} cameras: {after:.0f} MiB shared against {before:.0f} MiB with a session each "
        f"({after / before:.2f}x); {cameras} cameras / 1 camera with sharing: "
        f"{after / cases[('after', 1)]['rss_mb']:.2f}x.",
        "",
        machine_facts(),
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100, help="per camera, before measuring")
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--fps", type=float, default=15.0, help="each camera's rate")
    parser.add_argument("--size", default="640x480", help="camera frames, WxH")
    parser.add_argument("--threads", type=int, default=None, help="inference threads per session")
    parser.add_argument("--queue-size", type=int, default=2, help="each pipeline's queue_size")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each case, in rotation; medians are shown")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--share", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, EDGEINFER_STATE_DIR=f"{tmp}/state",
                   EDGEINFER_CACHE_DIR=f"{tmp}/cache")
        run_case(args, 1, True, env)  # fills the optimized-model cache: every case reads it
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for _ in range(args.repeats):  # in rotation: a noisy spell hits every case alike
            for mode in ("before", "after"):
                for n in (1, args.cameras):
                    runs.setdefault((mode, n), []).append(
                        run_case(args, n, mode == "after", env))
        cases = {key: _median(found) for key, found in runs.items()}
    print(render(cases, args.cameras, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
