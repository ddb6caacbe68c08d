"""Start-up with the measuring selector: the first boot's probe, later boots on the cached
decision, and a cached start against raw onnxruntime, each in fresh processes.

    python3 bench/startup.py [--repeats 5] [--model nudenet-320n] [--no-write]

1. First boot: ``load_model(path)`` with an empty state directory and an empty cache directory
   (no decision, no optimized graph, no OpenVINO compile cache), as on a new device: the
   probe's own time (``selection["elapsed_s"]``) and the whole ``load_model``.
2. Later boot: ``load_model(path)`` on the cached decision against ``load_model(path,
   probe=False)`` (no measuring: onnxruntime with its ranked providers), both on a warm cache
   directory, from the call to the first result; imports before the clock (the same for both).
3. Cold start: a process's import + load + first result, cached decision, against raw
   onnxruntime (``import onnxruntime``, ``InferenceSession`` with its defaults, first run);
   the clock starts at the script's first line, so the interpreter's own start is left out.
4. What ``import edgeinfer`` + ``from edgeinfer import load_model`` cost (``python -X
   importtime``, the largest cumulative imports).

Cases alternate (ABAB...) so a noisy spell hits both; medians. The results replace the
``startup`` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
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

_LOAD = r"""
import time
t0 = time.perf_counter()
import json, sys
import numpy as np
mode, path, cache = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "raw":
    import onnxruntime as ort
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    i = s.get_inputs()[0]
    s.run(None, {i.name: np.zeros(json.loads(sys.argv[4]), np.float32)})
    print("RESULT " + json.dumps({"total_ms": (time.perf_counter() - t0) * 1000}))
    raise SystemExit(0)
from edgeinfer import load_model
import onnxruntime  # noqa: F401  (imported by load_model anyway; before the clock for both)
t_import = time.perf_counter()
m = load_model(path, probe=mode != "noprobe", **({"cache_dir": cache} if cache else {}))
x = np.zeros(m.inputs[0].shape, np.float32)
m.run({m.inputs[0].name: x})
t_end = time.perf_counter()
sel = m.selection or {}
print("RESULT " + json.dumps({
    "total_ms": (t_end - t0) * 1000, "load_ms": (t_end - t_import) * 1000,
    "import_ms": (t_import - t0) * 1000, "probe_s": sel.get("elapsed_s"),
    "cached": sel.get("cached"), "picked": sel.get("picked", m.provider)}))
"""


def _run(mode: str, path: Path, env: dict[str, str], cache: str = "") -> dict[str, Any]:
    from edgeinfer.model.catalog import for_path

    entry = for_path(path)
    shape = list(entry.input_shapes[0][1]) if entry and entry.input_shapes else []
    proc = subprocess.run(["nice", "-n", "5", sys.executable, "-c", _LOAD, mode, str(path), cache,
                           json.dumps(shape)],
                          capture_output=True, text=True, env=env, check=False, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise SystemExit(f"{mode}: exit {proc.returncode}: {proc.stderr[-2000:]}")


def importtime(top: int = 8) -> tuple[float, list[tuple[str, float]]]:
    """``import edgeinfer; from edgeinfer import load_model``: the total and the largest
    cumulative imports (ms), from ``python -X importtime``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import edgeinfer; from edgeinfer import load_model"],
                          capture_output=True, text=True, check=True)
    rows: list[tuple[str, float, int]] = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cum_us, name = line.split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append((name.strip(), int(cum_us) / 1000, depth))
    total = sum(c for _, c, d in rows if d == 0)
    # The largest top-level or second-level packages, not their own children.
    tops = sorted(((n, c) for n, c, d in rows if d <= 1 and "." not in n.lstrip()
                   or n.startswith("edgeinfer") and d <= 1),
                  key=lambda x: -x[1])
    return total, tops[:top]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--first-boots", type=int, default=3)
    p.add_argument("--model", default="nudenet-320n")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args()
    from edgeinfer import catalog

    path = catalog.resolve_model(args.model)
    with tempfile.TemporaryDirectory(prefix="edgeinfer-startup-") as tmp:
        first = []
        for i in range(args.first_boots):
            # A new device: no decision, and no optimized graph or OpenVINO compile cache (an
            # empty cache_dir; the models cache stays where the example model is).
            env = dict(os.environ, EDGEINFER_STATE_DIR=f"{tmp}/first{i}/state")
            first.append(_run("probe", path, env, f"{tmp}/first{i}/cache"))
            print("first boot", first[-1], flush=True)
        env = dict(os.environ, EDGEINFER_STATE_DIR=f"{tmp}/state")
        # The decision and the caches of a device that booted before, in a cache directory of
        # this run's own (no optimized graph or compile cache written by older code).
        cache = f"{tmp}/cache"
        _run("probe", path, env, cache)
        _run("noprobe", path, env, cache)
        runs: dict[str, list[dict[str, Any]]] = {"cached": [], "noprobe": [], "raw": []}
        for i in range(args.repeats):
            order = list(runs) if i % 2 == 0 else list(runs)[::-1]
            for mode in order:
                runs[mode].append(_run("probe" if mode == "cached" else mode, path, env, cache))
        print({k: [round(r["total_ms"]) for r in v] for k, v in runs.items()}, flush=True)
    total_imp, tops = importtime()
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("total_ms", "load_ms")
               if f in v[0]} for k, v in runs.items()}
    probe_s = [r["probe_s"] for r in first]
    first_load = [r["load_ms"] / 1000 for r in first]
    picked = runs["cached"][0]["picked"]
    assert all(r["cached"] for r in runs["cached"]), "a later boot measured again"
    ratio_later = med["cached"]["load_ms"] / med["noprobe"]["load_ms"]
    ratio_cold = med["cached"]["total_ms"] / med["raw"]["total_ms"]
    spread_later = [c["load_ms"] / n["load_ms"] for c, n in zip(runs["cached"], runs["noprobe"])]
    spread_cold = [c["total_ms"] / r["total_ms"] for c, r in zip(runs["cached"], runs["raw"])]
    rows = [
        "| measure | edgeinfer | against | ratio (spread) | target |", "|---|---|---|---|---|",
        f"| first boot: the probe (`selection.elapsed_s`), s, median of {len(first)} (max) | "
        f"{statistics.median(probe_s):.1f} ({max(probe_s):.1f}) | | | <= 15 |",
        f"| first boot: the whole `load_model` (probe, compile, first run), s | "
        f"{statistics.median(first_load):.1f} ({max(first_load):.1f}) | | | report |",
        f"| later boot: `load_model` to first result on the cached decision vs `probe=False`, ms "
        f"| {med['cached']['load_ms']:.0f} | {med['noprobe']['load_ms']:.0f} | "
        f"{ratio_later:.2f} ({min(spread_later):.2f}-{max(spread_later):.2f}) | <= 1.10 |",
        f"| cold start: import + load + first result, cached decision vs raw onnxruntime "
        f"(import, `InferenceSession` defaults, first run), ms | {med['cached']['total_ms']:.0f} "
        f"| {med['raw']['total_ms']:.0f} | {ratio_cold:.2f} ({min(spread_cold):.2f}-"
        f"{max(spread_cold):.2f}) | report (was 1.3-1.8) |",
    ]
    imports = ", ".join(f"`{n}` {c:.0f}" for n, c in tops)
    body = "\n".join([
        f"Model: {args.model}; the pick on this machine: {picked} (threads = the physical cores). "
        f"Each figure from fresh processes, cases alternating, medians of {args.repeats} "
        f"(first boot: {len(first)} fresh state and cache directories). {machine_facts()}",
        "", *rows, "",
        f"`import edgeinfer; from edgeinfer import load_model`: {total_imp:.0f} ms in all "
        f"(`python -X importtime`); the largest cumulative imports, ms: {imports}.",
    ])
    print(body)
    if not args.no_write:
        cmd = f"python3 bench/startup.py --repeats {args.repeats}"
        write_section(ROOT / "docs" / "benchmarks.md", "startup",
                      "Start-up with the backend probe", body, cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
