"""Resident memory of edgeinfer's pick against the same backend opened raw, in fresh processes;
and the four-pipelines-on-one-model numbers of ``bench/shared.py``.

    python3 bench/memory.py [--repeats 3] [--models nudenet-320n,blazeface,ppocr-det]
                            [--shared-frames 100] [--no-write]

Per model: ``load_model(path)`` once with an empty state directory (the probe picks and caches),
then fresh processes, alternating: (a) ``load_model(path)`` (the cached pick) and five runs; (b)
the same backend opened raw with the pick's settings (onnxruntime: threads, optimization level,
spinning; OpenVINO: precision hint, threads, LATENCY; LiteRT: threads) and five runs. Each reads
its resident memory after every import (numpy, the backend, edgeinfer) and again after the
runs: "model" is the difference, "process" the whole. Medians. (Five runs, not one: onnxruntime
allocates its memory pattern on the second run, and edgeinfer's warm-up is a run.)

Then ``bench/shared.py`` runs as it is (1 and 4 live cameras on YOLOv8n-320, a session each
against one shared session) and its table is included. The results replace the ``memory``
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

_CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[4])
mode, key, state = sys.argv[1], sys.argv[2], sys.argv[3]
choice = json.loads(sys.argv[5])
RUNS = 5  # steady state: edgeinfer's warm-up is one more run, so a single run would not compare
import backend_cases as b
from edgeinfer.runtime.memory import rss_mb
case = b.CASE[key]
path = b.model_path(key)
if choice["backend"] == "onnxruntime":
    import onnxruntime
elif choice["backend"] == "openvino":
    import openvino
else:
    import ai_edge_litert.interpreter
import edgeinfer  # noqa: F401
from edgeinfer import load_model
base = rss_mb()
if mode == "edgeinfer":
    m = load_model(path, **b.load_kwargs(case, state))
    feeds = b.sample_feeds(case, m.inputs)
    for _ in range(RUNS):
        m.run(feeds[0])
    picked = m.selection["picked"]
else:
    if choice["backend"] == "onnxruntime":
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = choice["threads"]
        so.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[choice["opt"] or "all"]
        so.add_session_config_entry("session.intra_op.allow_spinning",
                                    "1" if choice["spin"] else "0")
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        feeds = b.sample_feeds(case, s.get_inputs())
        for _ in range(RUNS):
            s.run(None, feeds[0])
    elif choice["backend"] == "openvino":
        import openvino as ov
        core = ov.Core()
        model = core.read_model(str(path))
        shapes = b.case_shapes(case, path)
        if shapes:
            model.reshape({k: list(v) for k, v in shapes.items()})
        hint = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}[choice["precision"]]
        compiled = core.compile_model(model, "CPU", {
            "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": str(choice["threads"]),
            "PERFORMANCE_HINT": "LATENCY"})
        req = compiled.create_infer_request()
        class I:
            def __init__(self, p): self.name = p.get_any_name(); self.shape = list(p.get_shape())
        feeds = b.sample_feeds(case, [I(p) for p in compiled.inputs])
        for _ in range(RUNS):
            req.infer(feeds[0])
    else:
        from ai_edge_litert.interpreter import Interpreter
        it = Interpreter(model_path=str(path), num_threads=choice["threads"])
        it.allocate_tensors()
        d = it.get_input_details()[0]
        class I:
            name = d["name"]; shape = list(d["shape"])
        feeds = b.sample_feeds(case, [I()])
        for _ in range(RUNS):
            it.set_tensor(d["index"], next(iter(feeds[0].values())).astype(d["dtype"]))
            it.invoke()
    picked = ""
rss = rss_mb()
print("RESULT " + json.dumps({"base": base, "rss": rss, "model": rss - base, "picked": picked}))
"""


def _child(mode: str, key: str, state: str, choice: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(["nice", "-n", "5", sys.executable, "-c", _CHILD, mode, key, state,
                           str(ROOT / "bench"), json.dumps(choice)],
                          capture_output=True, text=True, check=False, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise SystemExit(f"{mode} {key}: exit {proc.returncode}: {proc.stderr[-2000:]}")


def pick_memory(key: str, repeats: int) -> dict[str, Any]:
    from backends import spawn

    with tempfile.TemporaryDirectory(prefix="edgeinfer-memory-") as state:
        probe = spawn("--child", "probe", "--model", key, "--state", state)
        (row,) = [c for c in probe["candidates"] if c["status"] == "picked"]
        choice = row["choice"]
        runs: dict[str, list[dict[str, Any]]] = {"edgeinfer": [], "raw": []}
        for i in range(repeats):
            for mode in (("edgeinfer", "raw") if i % 2 == 0 else ("raw", "edgeinfer")):
                runs[mode].append(_child(mode, key, state, choice))
    med = {m: {f: statistics.median(r[f] for r in v) for f in ("model", "rss")}
           for m, v in runs.items()}
    return {"key": key, "picked": probe["picked"], "choice": choice, **med}


def shared(frames: int) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "shared.py"), "--frames",
                           str(frames)], capture_output=True, text=True, check=False,
                          timeout=3600)
    if proc.returncode != 0:
        return f"`bench/shared.py` failed (exit {proc.returncode}): {proc.stderr[-500:]}"
    return proc.stdout.strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--models", default="nudenet-320n,blazeface,ppocr-det")
    p.add_argument("--shared-frames", type=int, default=100)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    results = []
    for key in args.models.split(","):
        results.append(pick_memory(key, args.repeats))
        print(results[-1], flush=True)
    rows = ["| model | pick | edgeinfer: model MiB (process MiB) | same backend raw: model MiB "
            "(process MiB) | model ratio | target |", "|---|---|---|---|---|---|"]
    for r in results:
        e, raw = r["edgeinfer"], r["raw"]
        ratio = e["model"] / raw["model"] if raw["model"] > 0 else float("nan")
        rows.append(f"| {r['key']} | {r['picked']} | {e['model']:.1f} ({e['rss']:.0f}) | "
                    f"{raw['model']:.1f} ({raw['rss']:.0f}) | {ratio:.2f}"
                    f"{'' if ratio <= 1.1 else ' **missed**'} | <= 1.10 |")
    four = shared(args.shared_frames)
    body = "\n".join([
        f"Resident memory after load + 5 runs, fresh processes, {args.repeats} each, "
        "alternating, medians; \"model\" = RSS after load + 5 runs minus RSS after every "
        "import (numpy, the backend, edgeinfer), \"process\" = the whole RSS. The raw side opens "
        "the backend edgeinfer picked with the pick's settings. " + machine_facts(), "",
        *rows, "",
        "### Four pipelines on one model (`bench/shared.py`)", "",
        f"`python3 bench/shared.py --frames {args.shared_frames}`, run by this script as it is:",
        "", four,
    ])
    print(body)
    if not args.no_write:
        cmd = f"python3 bench/memory.py --repeats {args.repeats} --shared-frames " \
              f"{args.shared_frames}"
        write_section(ROOT / "docs" / "benchmarks.md", "memory",
                      "Memory of the pick, and pipelines sharing a model", body, cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
