"""YOLOv8n-320 float against its INT8 version, both through edgeinfer, measured in one run.

    python3 bench/quantized.py [--rounds 10] [--runs 20] [--threads 2] [--no-write]

The INT8 model comes from ``edgeinfer.quantize.quantize_model`` (static QDQ, per-channel, this
machine's layout), calibrated on crops of half of the real photographs of
``edgeinfer.model.samples.sample_images()``, with preprocessing and the detect task taken from a
pipeline config written here (letterbox 320, YOLOv8 decoder). The other half (and its crops) is
held out:

1. Throughput: ``Model.run`` of both models on the held-out tensors, rounds alternating which
   goes first; medians of every timed run; INT8 speed-up = float ms / INT8 ms.
2. Accuracy: mAP@0.5 of INT8 detections (score >= 0.01) against the float model's detections
   (score >= the config's threshold) taken as ground truth, per class, all-point interpolated
   AP; plus the model card's own accuracy report.

The results replace the ``quantized`` section of docs/benchmarks.md (between its markers).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

import numpy as np

import edgeinfer
from edgeinfer import catalog, samples

SIZE = 320
# quantize_model keyword arguments of each INT8 variant measured.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "exclude-head": {"exclude_head": True},
    "quantized-head": {"quantize_head": True},
    "minmax": {"method": "minmax"},
}
CONFIG = """\
pipelines:
  - name: bench
    source: {{type: images, uri: "{images}"}}
    model: {{path: "{model}", threads: {threads}}}
    task:
      type: detect
      decoder: yolov8
      score_threshold: {threshold}
      iou_threshold: 0.5
      preprocess: {{resize: letterbox, size: [{size}, {size}]}}
    sinks: [{{type: stdout}}]
"""


def crops(img: np.ndarray, n: int) -> list[np.ndarray]:
    """The image, its mirror, and ``n`` - 2 centred and corner crops (60-85 % of each side)."""
    h, w = img.shape[:2]
    out = [img, img[:, ::-1].copy()]
    rng = np.random.default_rng(h * w)
    while len(out) < n:
        f = rng.uniform(0.6, 0.85)
        ch, cw = int(h * f), int(w * f)
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        out.append(np.ascontiguousarray(img[y:y + ch, x:x + cw]))
    return out


def write_sets(work: Path, per_photo: int) -> tuple[Path, Path, list[str]]:
    import cv2

    photos = samples.sample_images()
    calib, held = work / "calibration", work / "held-out"
    calib.mkdir()
    held.mkdir()
    for i, p in enumerate(photos):
        folder = calib if i % 2 == 0 else held
        img = cv2.imread(str(p))
        for j, c in enumerate(crops(img, per_photo)):
            cv2.imwrite(str(folder / f"{p.stem}-{j:02d}.png"), c)
    return calib, held, [p.stem for p in photos]


def ap50(ref: Sequence[Any], pred: Sequence[Any]) -> tuple[float, int]:
    """mAP@0.5 of ``pred`` against ``ref`` (lists per image of Detection), with the quantizer's
    own metric (`edgeinfer.tasks.metrics.mean_ap`), and the reference object count."""
    from edgeinfer.tasks.metrics import mean_ap

    def dets(ds: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.array([d.box for d in ds], np.float64).reshape(-1, 4),
                np.array([d.score for d in ds], np.float64),
                np.array([d.class_id for d in ds], np.int64))

    value, _ = mean_ap([dets(r) for r in ref], [dets(p) for p in pred])
    return (1.0 if value is None else value), sum(len(r) for r in ref)


def detections(task: Any, model: Any, tensors: list[tuple[Any, Any]]) -> list[Any]:
    name = model.inputs[0].name
    return [task.detect(model.run({name: x}), t) for x, t in tensors]


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from edgeinfer.config.loader import load_config
    from edgeinfer.frames import Frame
    from edgeinfer.quantize import quantize_model
    from edgeinfer.tasks.detect import DetectTask

    float_path = catalog.pull("nudenet-320n")
    calib, held, photos = write_sets(work, args.per_photo)
    config = work / "bench.yaml"
    config.write_text(CONFIG.format(images=held, model=float_path, threads=args.threads,
                                    threshold=args.threshold, size=SIZE))
    cards: dict[str, Any] = {}
    quantize_s: dict[str, float] = {}
    for variant in args.variants.split(","):
        start = time.perf_counter()
        # onnxruntime's quantization tools can leave <uuid>.data files in the working directory
        with contextlib.chdir(work):
            cards[variant] = quantize_model(
                float_path, work / f"nudenet-320n.{variant}.onnx", calib, config=config,
                pipeline="bench", held_out=held, samples=args.samples, force=True,
                **VARIANTS[variant])
        quantize_s[variant] = time.perf_counter() - start
    shapes = {"images": (1, 3, SIZE, SIZE)}
    paths = {"float": float_path, **{k: Path(c.path) for k, c in cards.items()}}
    models = {k: edgeinfer.load_model(p, threads=args.threads, input_shapes=shapes, name=k)
              for k, p in paths.items()}
    task_cfg = load_config(config).pipelines[0].task
    tasks = {k: DetectTask(task_cfg, m) for k, m in models.items()}
    import cv2

    images = [cv2.imread(str(p)) for p in sorted(held.glob("*.png"))]
    tensors = [tasks["float"].preprocess(Frame(i, 0.0, 0.0, img)) for i, img in
               enumerate(images)]
    feeds = [(f["images"], t) for f, t in tensors]
    ref = detections(tasks["float"], models["float"], feeds)
    low = _with_threshold(task_cfg, 0.01)
    accuracy = {k: ap50(ref, detections(DetectTask(low, models[k]), models[k], feeds))
                for k in cards}
    # The same two files in raw onnxruntime sessions, with edgeinfer's session options and with
    # onnxruntime's defaults: is the ratio the runtime's, or something edgeinfer adds?
    first = next(iter(cards), None)
    raw: dict[str, Any] = {}
    if first is not None:
        for label, edge_options in (("raw-same", True), ("raw-default", False)):
            for kind, path in (("float", float_path), ("int8", paths[first])):
                raw[f"{label}:{kind}"] = _raw_session(path, args.threads, edge_options)
    runners = {k: (lambda x, m=m: m.run({"images": x})) for k, m in models.items()}
    runners.update({k: (lambda x, s=s: s.run(None, {"images": x})) for k, s in raw.items()})
    times: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for r in range(args.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            run_once = runners[k]
            for i in range(args.runs):
                x = feeds[i % len(feeds)][0]
                t0 = time.perf_counter()
                run_once(x)
                times[k].append((time.perf_counter() - t0) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    raw_ratios = {label: med[f"{label}:float"] / med[f"{label}:int8"]
                  for label in ("raw-same", "raw-default") if f"{label}:float" in med}
    variants = {k: {"ms": med[k], "map50": accuracy[k][0], "card": cards[k].report,
                    "settings": cards[k].data["settings"],
                    "quantization": models[k].quantization, "quantize_s": quantize_s[k],
                    "mb": paths[k].stat().st_size / 2**20} for k in cards}
    out = {"float_ms": med["float"], "float_mb": float_path.stat().st_size / 2**20,
           "variants": variants, "n_ref": accuracy[next(iter(cards))][1] if cards else 0,
           "images": len(images), "photos": photos, "n_calib": len(list(calib.glob("*.png"))),
           "raw": {k: {"ratio": v, "float_ms": med[f"{k}:float"], "int8_ms": med[f"{k}:int8"]}
                   for k, v in raw_ratios.items()}, "raw_variant": first}
    for m in models.values():
        m.close()
    return out


def _raw_session(path: Path, threads: int, edge_options: bool) -> Any:
    """An onnxruntime session with edgeinfer's small-device options, or with its defaults
    (all graph optimizations, spinning threads) and the same thread count."""
    import onnxruntime as ort

    if edge_options:
        from edgeinfer.runtime.backends import onnx as backend
        from edgeinfer.runtime.base import SessionSpec

        spec = SessionSpec(path=path, format="onnx", sha256="", threads=threads,
                           options={"onnxruntime": backend.OnnxOptions("default")})
        so = backend.session_options(ort, spec, "CPUExecutionProvider")
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    else:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _with_threshold(cfg: Any, threshold: float) -> Any:
    import dataclasses

    import msgspec

    if isinstance(cfg, msgspec.Struct):
        return msgspec.structs.replace(cfg, score_threshold=threshold)
    return dataclasses.replace(cfg, score_threshold=threshold)


def render(r: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"YOLOv8n-320 float against INT8 made by `edgeinfer.quantize.quantize_model` (static "
        f"QDQ, per-channel, this machine's layout: {_layout(r)}), {args.threads} threads, CPU "
        f"provider, all through `Model.run`; {args.rounds} rounds of {args.runs} runs per model, "
        f"the order rotating, medians. Calibration: {r['n_calib']} images (crops and mirrors of "
        f"the photographs {', '.join(r['photos'][0::2])}); held out: {r['images']} images (of "
        f"{', '.join(r['photos'][1::2])}). mAP@0.5: INT8 detections (score >= 0.01) against "
        f"the float model's (score >= {args.threshold:g}, {r['n_ref']} objects) as ground truth. "
        f"{machine_facts()}",
        "",
        "| INT8 variant | ms per run, float / INT8 | INT8 throughput | mAP@0.5 vs float "
        "| model card's mAP@0.5 | MiB, float / INT8 | quantize, s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in r["variants"].items():
        card = v["card"] or {}
        lines.append(
            f"| `{name}` ({v['quantization']}) | {r['float_ms']:.2f} / {v['ms']:.2f} | "
            f"{r['float_ms'] / v['ms']:.2f} x (target >= 1.8) | {v['map50']:.3f} "
            f"(target >= 0.90) | {_num(card.get('map50'))} | {r['float_mb']:.1f} / "
            f"{v['mb']:.1f} | {v['quantize_s']:.0f} |")
    for label, text in (("raw-same", "raw onnxruntime, edgeinfer's session options"),
                        ("raw-default", "raw onnxruntime, its default options (all graph "
                         "optimizations, spinning threads)")):
        v = r["raw"].get(label)
        if v:
            lines.append(f"| {text}, `{r['raw_variant']}` file | {v['float_ms']:.2f} / "
                         f"{v['int8_ms']:.2f} | {v['ratio']:.2f} x | | | | |")
    described = []
    for k in r["variants"]:
        kw = ", ".join(f"{a}={b!r}" for a, b in VARIANTS[k].items())
        described.append(f"`{k}`: `quantize_model(...{', ' + kw if kw else ''})`")
    lines += ["", "Variants: " + "; ".join(described) + ". The reference is small (the "
              f"model's classes are few in these photographs: {r['n_ref']} objects), so one box "
              "found or missed moves mAP by a few points; the model card's figure is the "
              "quantizer's own report on the same held-out images."]
    return "\n".join(lines)


def _layout(r: dict[str, Any]) -> str:
    first = next(iter(r["variants"].values()), None)
    if first is None:
        return "n/a"
    s = first["settings"]
    return (f"activations {s['activation_type']}, weights {s['weight_type']}"
            f"{' (7-bit)' if s.get('reduce_range') else ''}, default method {s['method']}, "
            f"kept in float: {', '.join(s.get('float_types') or []) or 'nothing'} and the "
            "output node")


def _num(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) else "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-photo", type=int, default=40, help="crops per photograph")
    parser.add_argument("--samples", type=int, default=100, help="calibration samples at most")
    parser.add_argument("--threshold", type=float, default=0.1,
                        help="score threshold of the float reference detections")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"INT8 variants to make and measure, of {', '.join(VARIANTS)}")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-quant-") as tmp:
        result = run(args, Path(tmp))
    text = render(result, args)
    print(text)
    for name, v in result["variants"].items():
        print(f"model card report ({name}):", v["card"])
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "quantized", "INT8 against float",
                      text, f"python3 bench/quantized.py --rounds {args.rounds} --runs "
                      f"{args.runs} --threads {args.threads} --per-photo {args.per_photo} "
                      f"--threshold {args.threshold:g}")


if __name__ == "__main__":
    main()
