"""Runtimes compared on the same network, as ratios measured in one run.

    python3 bench/models.py [--rounds 200] [--runs 1] [--threads 1,2] [--no-write]

1. onnxruntime (through edgeinfer's ``Model.run``) against OpenCV's DNN module
   (``cv2.dnn.readNetFromONNX``) on the float YOLOv8n-320 model, same thread count
   (``cv2.setNumThreads``), on a real photograph; runs alternate between the two; medians of
   every timed run; outputs compared (max abs difference).
2. LiteRT against onnxruntime on BlazeFace short-range: the published ``.tflite`` and an ONNX
   conversion of that same file made here with ``tflite2onnx`` (a bench-only requirement:
   ``pip install tflite2onnx``; it has no TensorFlow dependency). Both run through
   ``edgeinfer.load_model``; outputs compared.

The results replace the ``models`` section of docs/benchmarks.md (between its markers).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

import numpy as np

import edgeinfer
from edgeinfer import catalog, samples

def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, runs: int) -> dict[str, float]:
    """Median ms per call of each function; rounds rotate which goes first."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn = fns[name]
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def yolo_input() -> np.ndarray:
    import cv2

    img = cv2.resize(samples.load_image(), (320, 320), interpolation=cv2.INTER_AREA)
    x = img[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255.0
    return np.ascontiguousarray(x)


def opencv_vs_ort(threads: int, rounds: int, runs: int) -> dict[str, Any]:
    import cv2

    path = catalog.pull("nudenet-320n")
    x = yolo_input()
    model = edgeinfer.load_model(path, threads=threads, input_shapes={"images": x.shape})
    ref = model.run({"images": x})[model.outputs[0].name]
    row: dict[str, Any] = {"threads": threads, "ort": None, "cv2": None, "diff": None,
                           "error": None, "scale": float(np.abs(ref).max())}
    try:
        cv2.setNumThreads(threads)
        net = cv2.dnn.readNetFromONNX(str(path))

        def cv_run() -> Any:
            net.setInput(x)
            return net.forward()

        out = cv_run()
        row["diff"] = float(np.abs(out.reshape(ref.shape) - ref).max())
    except cv2.error as exc:
        row["error"] = str(exc).strip().splitlines()[-1]
        cv_run = None  # type: ignore[assignment]
    fns: dict[str, Callable[[], Any]] = {"ort": lambda: model.run({"images": x})}
    if cv_run is not None:
        fns["cv2"] = cv_run
    row.update(interleaved(fns, rounds, runs))
    model.close()
    return row


def blazeface_input() -> np.ndarray:
    import cv2

    img = cv2.resize(samples.load_image(), (128, 128), interpolation=cv2.INTER_AREA)
    return (img[:, :, ::-1].astype(np.float32) / 127.5 - 1.0)[None]


def convert_blazeface(out_dir: Path) -> tuple[Path, Path]:
    import tflite2onnx

    tfl = catalog.pull("blazeface")
    onnx_path = out_dir / "blazeface.onnx"
    tflite2onnx.convert(str(tfl), str(onnx_path))
    return tfl, onnx_path


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(z, -50, 50)))


def litert_vs_ort(threads: int, rounds: int, runs: int, tfl: Path, onnx_path: Path
                  ) -> dict[str, Any]:
    nhwc = blazeface_input()
    nchw = np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2))  # tflite2onnx makes the input NCHW
    lite = edgeinfer.load_model(tfl, threads=threads)
    ort = edgeinfer.load_model(onnx_path, threads=threads)
    a, b = lite.run(nhwc), ort.run(nchw)
    diffs = {k: float(np.abs(a[k] - b[k]).max()) for k in a}
    scores = {"tflite": sigmoid(a["classificators"]), "onnx": sigmoid(b["classificators"])}
    med = interleaved({"litert": lambda: lite.run(nhwc), "ort": lambda: ort.run(nchw)},
                      rounds, runs)
    row = {"threads": threads, **med, "diffs": diffs, "lite_provider": lite.provider,
           "ort_provider": ort.provider,
           "score_diff": float(np.abs(scores["tflite"] - scores["onnx"]).max()),
           "onnx_mb": onnx_path.stat().st_size / 2**20, "tflite_mb": tfl.stat().st_size / 2**20}
    lite.close()
    ort.close()
    return row


def render(cv_rows: list[dict[str, Any]], lt_rows: list[dict[str, Any]],
           args: argparse.Namespace) -> str:
    import cv2
    import tflite2onnx

    lines = [
        f"Same network, same thread count, in one process; {args.rounds} rounds of "
        f"{args.runs} run(s) of each, alternating (first of each round rotating), medians of all "
        f"{args.rounds * args.runs} timed runs per side; inputs made from a real photograph. "
        f"{machine_facts()} OpenCV {cv2.__version__}.",
        "",
        "### onnxruntime vs OpenCV DNN (YOLOv8n-320, float, 1x3x320x320)",
        "",
        "| threads | onnxruntime (`Model.run`), ms | `cv2.dnn`, ms | onnxruntime speed-up | "
        "max abs diff of outputs |",
        "|---|---|---|---|---|",
    ]
    for r in cv_rows:
        if r["error"]:
            lines.append(f"| {r['threads']} | {r['ort']:.2f} | could not load: {r['error']} | | |")
            continue
        lines.append(f"| {r['threads']} | {r['ort']:.2f} | {r['cv2']:.2f} | "
                     f"{r['cv2'] / r['ort']:.2f} x | {r['diff']:.2g} (outputs up to "
                     f"{r['scale']:.0f}) |")
    lines += [
        "",
        "### LiteRT vs onnxruntime (BlazeFace short-range, 1x128x128x3)",
        "",
        f"The `.tflite` as published and an ONNX conversion of that file made by the script with "
        f"`tflite2onnx` {tflite2onnx.__version__} (a bench-only requirement, "
        f"`pip install tflite2onnx`; no TensorFlow). The converted graph takes NCHW input. "
        f"Both through `edgeinfer.load_model`.",
        "",
        "| threads | LiteRT, ms | onnxruntime, ms | LiteRT speed-up | max abs diff "
        "(regressors / scores after sigmoid) |",
        "|---|---|---|---|---|",
    ]
    for r in lt_rows:
        d = r["diffs"]
        lines.append(f"| {r['threads']} | {r['litert']:.3f} ({r['lite_provider']}) | "
                     f"{r['ort']:.3f} ({r['ort_provider'].removesuffix('ExecutionProvider')}) | "
                     f"{r['ort'] / r['litert']:.2f} x | {d['regressors']:.2g} / "
                     f"{r['score_diff']:.2g} |")
    lines += [
        "",
        "Reading: each ratio compares two runtimes on the same input in the same process, "
        "alternating, so load from other work on this shared machine hits both; the absolute "
        "milliseconds move from run to run (on 2 shared cores a second thread does not always "
        "help). The output differences are float rounding (different kernels and summation "
        "order), far below what changes a detection.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    cv_rows = [opencv_vs_ort(t, args.rounds, args.runs) for t in threads]
    with tempfile.TemporaryDirectory() as tmp:
        tfl, onnx_path = convert_blazeface(Path(tmp))
        lt_rows = [litert_vs_ort(t, args.rounds, args.runs, tfl, onnx_path) for t in threads]
    text = render(cv_rows, lt_rows, args)
    print(text)
    if not args.no_write:
        command = f"python3 bench/models.py --rounds {args.rounds} --runs {args.runs} " \
                  f"--threads {args.threads}"
        write_section(ROOT / "docs" / "benchmarks.md", "models",
                      "Runtimes compared on the same network", text, command)


if __name__ == "__main__":
    main()
