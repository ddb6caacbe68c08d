"""Batching benchmark: four handles sharing YOLOv8n-320 (``nudenet-320n``), each fed as fast as
it takes frames, on each backend here: throughput batched against round-robin, and what
``model.batch: auto`` picks.

    python3 bench/batching.py [--seconds 6] [--repeats 3] [--threads N] [--write]

For each backend installed here (onnxruntime CPU, OpenVINO CPU; fp32, ``--threads`` intra-op
threads, default the runtime's) the model is opened on exactly that configuration and shared
by ``--cameras`` handles (``ModelPool.adopt``), each in its own thread, running a frame, taking
the result, running the next. Cases, in rotation so a noisy spell hits each alike:
``batch: off`` (round-robin, as before batching), ``batch: N`` (every batch of N, the frames
of all handles) and ``batch: auto`` (its measurement: N single runs against one batch of N,
interleaved; its pick and the throughput it gives). The frames per second of all handles
together over ``--seconds`` after the decision and 3 s of warming up, median over
``--repeats``. ``--write`` puts
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
WARM_S = 3.0


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
        flood(handles, WARM_S)  # every case as warm: the first seconds of a session are slower
        fps = flood(handles, seconds)
        return fps, handles[0].shared_stats()["batch"] | {"decided": stats}
    finally:
        for h in handles:
            h.close()


def measure_backend(choice: Choice, args: argparse.Namespace) -> dict[str, Any]:
    fps: dict[str, list[float]] = {"off": [], "batch": [], "auto": []}
    autos: list[dict[str, Any]] = []
    policies = {"off": batch_policy("off"), "batch": batch_policy(args.cameras),
                "auto": batch_policy("auto")}
    for _ in range(args.repeats):  # in rotation: a noisy spell hits each case alike
        for name, policy in policies.items():
            value, stats = case(choice, args.threads, policy, args.cameras, args.seconds)
            fps[name].append(value)
            if name == "auto":
                autos.append(stats)
    return {"label": choice.label(), "autos": autos, "runs": fps,
            **{k: statistics.median(v) for k, v in fps.items()}}


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    from _report import machine_facts

    lines = [
        f"YOLOv8n-320 (`nudenet-320n`, float, 1x3x320x320) shared by {args.cameras} handles, "
        f"each in its own thread running frames as fast as it is served; {args.threads} "
        f"intra-op threads; frames per second of all handles together over {args.seconds:g} s "
        f"after the decision and {WARM_S:g} s of warming up, median of {args.repeats} runs "
        "of each case in rotation (each on a freshly opened model). "
        f"`batch: auto` measures {args.cameras} single runs against one batch, interleaved, "
        "and batches only at >= 1.1x (and in 2/3 of the rounds): its measured speedup and "
        "pick in each run.",
        "",
        f"| backend | round-robin fps | batch of {args.cameras} fps | batched / round-robin | "
        "auto measured (each run) | auto picks | auto fps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        measured = ", ".join(f"{(a['measurement'] or {}).get('speedup', 0):.2f}x"
                             for a in r["autos"])
        picks = sorted({a["mode"] for a in r["autos"]})
        counts = ", ".join(f"{p} {sum(a['mode'] == p for a in r['autos'])}/{len(r['autos'])}"
                           for p in picks)
        lines.append(f"| {r['label']} | {r['off']:.1f} | {r['batch']:.1f} | "
                     f"{r['batch'] / r['off']:.2f}x | {measured} | {counts} | "
                     f"{r['auto']:.1f} |")
    lines += ["", machine_facts()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cameras", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backends", default="", help="only these, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="into docs/benchmarks.md")
    args = parser.parse_args()
    rows = []
    wanted = {b for b in args.backends.split(",") if b}
    for choice in backends(args.threads):
        if wanted and choice.backend not in wanted:
            continue
        row = measure_backend(choice, args)
        reasons = "; ".join(a["reason"] for a in row["autos"])
        print(f"{row['label']}: fps of each run: " + "; ".join(
            f"{k} " + ", ".join(f"{v:.1f}" for v in vs) for k, vs in row["runs"].items()))
        print(f"{row['label']}: round-robin {row['off']:.1f} fps, batched {row['batch']:.1f} "
              f"fps, auto {row['auto']:.1f} fps ({reasons})", flush=True)
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
