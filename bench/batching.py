"""Batching benchmark: four handles sharing YOLOv8n-320 (``nudenet-320n``), each fed as fast as
it takes frames, on each backend here: throughput batched against round-robin, and what
``model.batch: auto`` picks.

    python3 bench/batching.py [--seconds 6] [--repeats 3] [--threads N] [--write]

For each backend installed here (onnxruntime CPU, OpenVINO CPU; fp32, ``--threads`` intra-op
threads, default the runtime's) the model is opened on exactly that configuration and shared
by ``--cameras`` handles (``ModelPool.adopt``), each in its own thread, running a frame, taking
the result, running the next. Cases, in rotation so a noisy spell hits each alike:
``batch: off`` (round-robin, as before batching) and ``batch: N`` (every batch of N, the
frames of all handles). The frames per second of all handles together over ``--seconds``,
median over ``--repeats``. Then ``batch: auto`` on a fresh share: its measurement (N single
runs against one batch of N, interleaved), its decision and its throughput. ``--write`` puts
the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from edgeinfer.model.load import load_model, open_model
from edgeinfer.model.model import Model
from edgeinfer.model.pool import SharedModel, model_pool
from edgeinfer.runtime.backends import module
from edgeinfer.runtime.batching import BatchPolicy, batch_policy
from edgeinfer.runtime.choice import Choice

MODEL = "nudenet-320n"


def backends(threads: int) -> list[Choice]:
    """The backend configurations installed here, fp32."""
    found = [Choice("onnxruntime", "CPUExecutionProvider", "fp32", threads, "all")]
    if module("openvino").available():
        found.append(Choice("openvino", "CPU", "fp32", threads))
    return found


def open_on(choice: Choice, threads: int) -> Model:
    """YOLOv8n-320 on exactly ``choice``."""
    base = load_model(MODEL, probe=False, threads=threads)
    try:
        spec = base.spec.replace(choice=choice, probe=False)
        return open_model(spec, base.file_info, f"{MODEL}-{choice.backend}", None)
    finally:
        base.close()


def share(model: Model, policy: BatchPolicy, cameras: int) -> list[SharedModel]:
    first = model_pool().adopt(model, policy)
    return [first, *(first.another(f"cam{i}") for i in range(1, cameras))]


def flood(handles: list[SharedModel], seconds: float) -> float:
    """Frames per second of all handles together, each running as fast as it is served."""
    x = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
    counts = [0] * len(handles)
    stop = threading.Event()

    def run(i: int) -> None:
        while not stop.is_set():
            handles[i].run({"images": x})
            counts[i] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    time.sleep(min(1.0, seconds / 4))  # everyone in the rhythm
    start, t0 = sum(counts), time.perf_counter()
    time.sleep(seconds)
    done, elapsed = sum(counts), time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join(60)
    return (done - start) / elapsed


def decided(handles: list[SharedModel], timeout_s: float = 120.0) -> dict[str, Any]:
    """Feed the handles until the batcher decided; its stats."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flood(handles, 0.5)
        stats: dict[str, Any] = handles[0].shared_stats()["batch"]
        if stats["measurement"] is not None or stats["size"]:
            return stats
    raise SystemExit("the batcher did not decide in time")


def case(choice: Choice, threads: int, policy: BatchPolicy, cameras: int,
         seconds: float) -> tuple[float, dict[str, Any]]:
    handles = share(open_on(choice, threads), policy, cameras)
    try:
        stats = decided(handles) if policy.mode != "off" else {}
        fps = flood(handles, seconds)
        return fps, handles[0].shared_stats()["batch"] | {"decided": stats}
    finally:
        for h in handles:
            h.close()


def measure_backend(choice: Choice, args: argparse.Namespace) -> dict[str, Any]:
    fps: dict[str, list[float]] = {"off": [], "batch": []}
    stats: dict[str, Any] = {}
    for _ in range(args.repeats):
        fps["off"].append(case(choice, args.threads, batch_policy("off"), args.cameras,
                               args.seconds)[0])
        value, stats = case(choice, args.threads, batch_policy(args.cameras), args.cameras,
                            args.seconds)
        fps["batch"].append(value)
    auto_fps, auto = case(choice, args.threads, batch_policy("auto"), args.cameras,
                          args.seconds)
    return {"label": choice.label(), "off": statistics.median(fps["off"]),
            "batch": statistics.median(fps["batch"]), "fixed": stats, "auto": auto,
            "auto_fps": auto_fps}


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    from _report import machine_facts

    lines = [
        f"YOLOv8n-320 (`nudenet-320n`, float, 1x3x320x320) shared by {args.cameras} handles, "
        f"each in its own thread running frames as fast as it is served; {args.threads} "
        f"intra-op threads; frames per second of all handles together over {args.seconds:g} s, "
        f"median of {args.repeats} runs in rotation. `batch: auto` measures {args.cameras} "
        "single runs against one batch, interleaved, and batches only at >= 1.1x.",
        "",
        f"| backend | round-robin fps | batch of {args.cameras} fps | batched / round-robin | "
        "auto measured | auto picks | auto fps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r["auto"]["measurement"] or {}
        lines.append(
            f"| {r['label']} | {r['off']:.1f} | {r['batch']:.1f} | "
            f"{r['batch'] / r['off']:.2f}x | {m.get('speedup', 0):.2f}x "
            f"({m.get('single_ms', 0):.1f} ms x {m.get('size', 0)} vs "
            f"{m.get('batch_ms', 0):.1f} ms) | {r['auto']['mode']} | {r['auto_fps']:.1f} |")
    lines += ["", machine_facts()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="into docs/benchmarks.md")
    args = parser.parse_args()
    rows = []
    for choice in backends(args.threads):
        row = measure_backend(choice, args)
        print(f"{row['label']}: round-robin {row['off']:.1f} fps, batched {row['batch']:.1f} "
              f"fps, auto {row['auto']['mode']} ({row['auto']['reason']})", flush=True)
        rows.append(row)
    text = render(rows, args)
    print(text)
    if args.write:
        from _report import write_section

        write_section(ROOT / "docs" / "benchmarks.md", "batching",
                      "Batching across cameras that share a model", text,
                      "python3 bench/batching.py --write")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
