"""Where a detector's class names come from, and the built-in COCO names.

In order: the task's ``labels:`` (a file, a list, or a built-in name: ``coco``, ``coco91``),
the model file's metadata (Ultralytics' ``names``), a label file packed into a TFLite model
(its metadata zip), a ``labels.txt`` beside the model, the decoder's own (BlazeFace: ``face``).
The source is logged, so labels never appear from nowhere.
"""

from __future__ import annotations

import json
import logging
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..config.pipeline import BUILTIN_LABELS
from ..errors import ConfigError, ModelFormatError
from .base import label_lines, load_labels
from .decoders.meta import parse_names

__all__ = ["COCO80", "COCO91", "file_metadata", "find_labels", "looks_like_coco80"]

logger = logging.getLogger(__name__)

COCO80 = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)
"""The 80 COCO detection classes, in the order of Ultralytics' and Darknet's class ids."""

# COCO category ids (1..90) that the detection set leaves unused.
_COCO91_GAPS = (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)


def _coco91() -> tuple[str, ...]:
    names = iter(COCO80)
    return ("background",) + tuple("N/A" if i in _COCO91_GAPS else next(names)
                                   for i in range(1, 91))


COCO91 = _coco91()
"""Names by COCO category id (0 is the background, unused ids ``N/A``): the numbering of the
TensorFlow Object Detection API and torchvision's detectors."""

_BUILTIN = {"coco": COCO80, "coco91": COCO91}
assert set(_BUILTIN) == set(BUILTIN_LABELS)

_PACKED_MAX = 1 << 20  # a label file or metadata.json packed into a TFLite model
_PACKED_LABELS = ("labels.txt", "labelmap.txt", "label_map.txt")
_MAX_DEPTH = 32  # lists and dicts in a packed metadata.json


def file_metadata(path: Path, fmt: str, onnx_metadata: Mapping[str, str]) -> dict[str, str]:
    """The model file's metadata: ONNX ``metadata_props``, or the ``metadata.json`` that
    Ultralytics packs into a TFLite model (values as strings, as ONNX has them)."""
    if fmt != "tflite":
        return dict(onnx_metadata)
    raw = _packed(path, ("metadata.json",))
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    except RecursionError:  # the C scanner stops at the interpreter's recursion limit
        data = None
    if data is None or _depth(data) > _MAX_DEPTH:
        raise ModelFormatError(f"model {path}: its packed metadata.json is nested more than "
                               f"{_MAX_DEPTH} deep; Ultralytics writes 3 at most: re-export it")
    if not isinstance(data, dict):
        return {}
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}


def _depth(value: object) -> int:
    """How deep ``value``'s lists and dicts nest (counted up to one past ``_MAX_DEPTH``)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            if depth > _MAX_DEPTH:
                return depth
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return deepest


def find_labels(configured: str | list[str] | None, model_path: Path, fmt: str,
                metadata: Mapping[str, str]) -> tuple[list[str] | None, str]:
    """The labels and where they came from (``None, "none"`` when nothing names the classes).

    Raises:
        ConfigError: a configured label file cannot be read, or the metadata's names are
            malformed.
    """
    if isinstance(configured, str) and configured in _BUILTIN:
        return list(_BUILTIN[configured]), f"built-in {configured}"
    if configured is not None:
        return load_labels(configured), "labels:"
    names = parse_names(metadata)
    if names is not None:
        return names, "the model's metadata (names)"
    if fmt == "tflite":
        raw = _packed(model_path, _PACKED_LABELS)
        if raw is not None:
            text = raw.decode("utf-8", "replace")
            where = f"the label file packed in model {model_path}"
            return label_lines(text, where, ModelFormatError), "the label file packed in the model"
    beside = model_path.parent / "labels.txt"
    if beside.is_file():
        return load_labels(str(beside)), str(beside)
    return None, "none"


def looks_like_coco80(labels: Sequence[str]) -> bool:
    """80 labels of which most are COCO's names (Darknet's spellings differ in a few)."""
    if len(labels) != 80:
        return False
    known = {_norm(n) for n in COCO80}
    return sum(_norm(n) in known for n in labels) >= 60


def _norm(name: str) -> str:
    return name.lower().replace(" ", "").replace("_", "")


def _packed(path: Path, names: Sequence[str]) -> bytes | None:
    """The first of ``names`` in the zip a TFLite model carries after its flatbuffer."""
    try:
        if not zipfile.is_zipfile(path):
            return None
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if Path(info.filename).name.lower() in names and info.file_size <= _PACKED_MAX:
                    logger.debug("reading %s packed in %s", info.filename, path)
                    return z.read(info)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"model {path}: its packed metadata cannot be read: {exc}") from exc
    return None
