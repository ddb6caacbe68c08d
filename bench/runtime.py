"""Runtime-core benchmark: edgeinfer against raw onnxruntime, as ratios measured in one run.

    python3 bench/runtime.py [--rounds 7] [--runs 20] [--no-write]

1. Throughput: ``Model.run`` vs a raw ``InferenceSession.run`` loop with the same threads and
   session options, on the YOLOv8n-320 model; rounds alternate between the two so that noise
   from this shared machine hits both alike; medians of per-round means.
2. Resident memory after load + first run, each variant in a fresh subprocess (median of 3):
   raw onnxruntime with its defaults, raw with edgeinfer's options, and edgeinfer with each
   arena setting.
3. Cold start (load to first result) with and without the optimized-model cache, fresh
   subprocesses, median of 5.

The results replace the runtime section of docs/benchmarks.md (between its markers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

SHAPE = (1, 3, 320, 320)
THREADS = 2

# One subprocess measurement: prints a JSON line. Baseline is taken after every import, so the
# numbers are what the model costs, not the interpreter.
_MEMORY_CHILD = r"""
import json, sys, numpy as np, onnxruntime as ort, edgeinfer
from edgeinfer.runtime.memory import rss_mb
from edgeinfer.runtime.backends import onnx as backend
from edgeinfer.runtime.base import SessionSpec
path, variant, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
x = np.random.default_rng(0).random((1, 3, 320, 320), dtype=np.float32)
base = rss_mb()
if variant == "raw-default":
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    s.run(None, {"images": x})
elif variant == "raw-same-options":
    spec = SessionSpec(path=path, format="onnx", sha256="", threads=threads,
                       options={"onnxruntime": backend.OnnxOptions("default")})
    so = backend.session_options(ort, spec, "CPUExecutionProvider")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    s.run(None, {"images": x})
else:
    arena = variant.split("=", 1)[1]
    # load_model's warm-up is the first run (zeros; the raw variants run random data once)
    m = edgeinfer.load_model(path, threads=threads, arena=arena, optimized_model_cache=False,
                             input_shapes={"images": (1, 3, 320, 320)})
first = rss_mb() - base
run = (lambda: s.run(None, {"images": x})) if variant.startswith("raw") else (lambda: m.run(x))
for _ in range(50):
    run()
print(json.dumps({"rss_mb": first, "rss_after_50_mb": rss_mb() - base}))
"""

_COLD_CHILD = r"""
import json, sys, time
t_start = time.perf_counter()
import numpy as np, onnxruntime, edgeinfer, edgeinfer.model
t0 = time.perf_counter()
path, cache_dir, use_cache = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
m = edgeinfer.load_model(path, threads=2, cache_dir=cache_dir, optimized_model_cache=use_cache,
                         input_shapes={"images": (1, 3, 320, 320)})
m.run(np.zeros((1, 3, 320, 320), np.float32))
t1 = time.perf_counter()
print(json.dumps({"ms": (t1 - t0) * 1000, "process_ms": (t1 - t_start) * 1000,
                  "cache": m.report.cache}))
"""


def _child(code: str, *args: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(path: Path, rounds: int, runs: int) -> dict[str, float]:
    import numpy as np
    import onnxruntime as ort

    import edgeinfer
    from edgeinfer.runtime.backends import onnx as backend
    from edgeinfer.runtime.base import SessionSpec

    x = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
    model = edgeinfer.load_model(path, threads=THREADS, input_shapes={"images": SHAPE},
                                 optimized_model_cache=False)
    spec = SessionSpec(path=path, format="onnx", sha256="", threads=THREADS,
                       options=model._spec.options)
    so = backend.session_options(ort, spec, "CPUExecutionProvider")
    so.add_free_dimension_override_by_name("batch", 1)
    so.add_free_dimension_override_by_name("height", 320)
    so.add_free_dimension_override_by_name("width", 320)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    raw = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {"images": x}
    raw.run(None, feeds)

    # Single runs interleaved (ours, raw, raw, ours, ...): a burst of load from a neighbour
    # lands on both sides alike; medians drop the bursts.
    ours, theirs = [], []
    for i in range(rounds * runs):
        order = ((ours, model.run, (feeds,)), (theirs, raw.run, (None, feeds)))
        for times, fn, fn_args in order if i % 2 == 0 else reversed(order):
            t = time.perf_counter()
            fn(*fn_args)
            times.append(time.perf_counter() - t)
    model.close()
    t_ours, t_raw = statistics.median(ours), statistics.median(theirs)
    return {"ours_ms": t_ours * 1000, "raw_ms": t_raw * 1000, "ratio": t_raw / t_ours}


def arena_speed(path: Path, rounds: int, runs: int) -> dict[str, float]:
    """ms per run of edgeinfer with each arena setting, loaded side by side, runs rotated."""
    import numpy as np

    import edgeinfer

    feeds = {"images": np.random.default_rng(0).random(SHAPE, dtype=np.float32)}
    models = {a: edgeinfer.load_model(path, threads=THREADS, arena=a, optimized_model_cache=False,
                                      input_shapes={"images": SHAPE}, name=a)
              for a in ("bounded", "off", "default")}
    times: dict[str, list[float]] = {a: [] for a in models}
    names = list(models)
    for i in range(rounds * runs):
        for a in names[i % 3:] + names[: i % 3]:
            t = time.perf_counter()
            models[a].run(feeds)
            times[a].append((time.perf_counter() - t) * 1000)
    for m in models.values():
        m.close()
    return {a: statistics.median(v) for a, v in times.items()}


def memory(path: Path, repeats: int = 3) -> dict[str, tuple[float, float]]:
    """Per variant: median MiB after load + first run, and after 50 more runs."""
    variants = ["raw-default", "raw-same-options", "edgeinfer:arena=bounded",
                "edgeinfer:arena=off", "edgeinfer:arena=default"]
    out = {}
    for v in variants:
        runs = [_child(_MEMORY_CHILD, str(path), v, str(THREADS)) for _ in range(repeats)]
        out[v] = (statistics.median(r["rss_mb"] for r in runs),
                  statistics.median(r["rss_after_50_mb"] for r in runs))
    return out


def cold_start(path: Path, repeats: int = 5) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache:
        first = _child(_COLD_CHILD, str(path), cache, "1")  # fills the cache
        assert first["cache"] == "miss", first
        hit = [_child(_COLD_CHILD, str(path), cache, "1") for _ in range(repeats)]
        assert all(h["cache"] == "hit" for h in hit), hit
        off = [_child(_COLD_CHILD, str(path), cache, "0") for _ in range(repeats)]
    with_cache = statistics.median(h["ms"] for h in hit)
    without = statistics.median(o["ms"] for o in off)
    return {"with_cache_ms": with_cache, "without_cache_ms": without,
            "ratio": without / with_cache,
            "process_with_ms": statistics.median(h["process_ms"] for h in hit),
            "process_without_ms": statistics.median(o["process_ms"] for o in off)}


def render(tp: dict[str, float], mem: dict[str, float], cold: dict[str, float],
           speed: dict[str, float], args: argparse.Namespace) -> str:
    from edgeinfer.runtime.backends.onnx import DEFAULT_ARENA

    raw = mem["raw-same-options"][0]
    chosen = mem[f"edgeinfer:arena={DEFAULT_ARENA}"][0]
    lines = [
        f"Model: YOLOv8n-320 (`nudenet-320n`, float), input 1x3x320x320, {THREADS} threads, CPU "
        f"provider. {machine_facts()}",
        "",
        "| measure | edgeinfer | raw onnxruntime | ratio | target |",
        "|---|---|---|---|---|",
        f"| `Model.run` vs `InferenceSession.run`, ms per run ({args.rounds * args.runs} "
        f"interleaved runs each, medians) | {tp['ours_ms']:.2f} | {tp['raw_ms']:.2f} | "
        f"{tp['ratio']:.3f} x throughput | >= 0.98 |",
        f"| resident memory after load + first run, MiB (edgeinfer's default arena "
        f"`{DEFAULT_ARENA}` vs raw with the same options) | {chosen:.1f} | {raw:.1f} | "
        f"{chosen / raw:.3f} | <= 1.10 |",
        f"| cold start, `load_model` to first result, ms (optimized-model cache vs none; fresh "
        f"processes, median of 5) | {cold['with_cache_ms']:.0f} | "
        f"{cold['without_cache_ms']:.0f} (no cache) | {cold['ratio']:.2f} x faster | report |",
        f"| the same including Python and onnxruntime imports, ms | "
        f"{cold['process_with_ms']:.0f} | {cold['process_without_ms']:.0f} (no cache) | "
        f"{cold['process_without_ms'] / cold['process_with_ms']:.2f} x faster | report |",
        "",
        "Resident memory after load + first run, each in a fresh process (median of 3), and "
        "speed of each arena setting (models side by side, runs rotated, median ms per run):",
        "",
        "| variant | MiB after load + first run | vs raw defaults | MiB after 50 more runs "
        "| ms per run |",
        "|---|---|---|---|---|",
    ]
    base = mem["raw-default"][0]
    for name, (first, later) in mem.items():
        arena = name.partition("=")[2]
        ms = f"{speed[arena]:.2f}" if arena in speed else ""
        lines.append(f"| {name} | {first:.1f} | {first / base:.3f} | {later:.1f} | {ms} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    from edgeinfer import catalog

    path = catalog.pull("nudenet-320n")
    tp = throughput(path, args.rounds, args.runs)
    mem = memory(path)
    cold = cold_start(path)
    speed = arena_speed(path, args.rounds, args.runs)
    text = render(tp, mem, cold, speed, args)
    print(text)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "runtime", "Runtime core", text,
                      f"python3 bench/runtime.py --rounds {args.rounds} --runs {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
