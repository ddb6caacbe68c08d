"""What a model file's metadata says about its outputs: Ultralytics' ``names``, ``task``,
``imgsz``, ``kpt_shape``, ``end2end`` (ONNX ``metadata_props``, or the ``metadata.json`` an
Ultralytics TFLite export packs), read safely (``ast.literal_eval``, never ``eval``).

Values arrive as strings: Python literals from the ONNX export (``{0: 'person', ...}``), JSON
from the TFLite one (``{"0": "person"}``); both parse here.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError

__all__ = ["ModelMeta", "parse_names", "read_meta"]

# Ultralytics tasks that the detect decoders must not read as boxes, and the task type to use.
OTHER_TASKS = {"pose": "pose", "segment": "segment", "obb": "obb", "classify": "classify"}


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """The metadata facts the decoders use (``None``: the file does not say).

    Attributes:
        names: Class names by id.
        task: ``detect``, ``pose``, ``segment``, ``obb``, ``classify``.
        imgsz: ``(width, height)`` the model was exported at.
        kpt_shape: ``(keypoints, values per keypoint)`` of a pose model.
        end2end: The export has its NMS-free head (``[1, K, 6]`` rows).
        rtdetr: The description names RT-DETR.
        ultralytics: Written by Ultralytics.
    """

    names: list[str] | None = None
    task: str | None = None
    imgsz: tuple[int, int] | None = None
    kpt_shape: tuple[int, int] | None = None
    end2end: bool | None = None
    rtdetr: bool = False
    ultralytics: bool = False


def read_meta(metadata: Mapping[str, str]) -> ModelMeta:
    """The facts in ``metadata``.

    Raises:
        ConfigError: ``names`` is there but not a class-id -> name table.
    """
    args = _literal(metadata.get("args"))
    end2end = _flag(metadata.get("end2end"))
    if end2end is None and isinstance(args, dict) and args.get("nms") is True:
        end2end = True  # `nms=True` exports end in the same [1, K, 6] rows
    kpt = _ints(metadata.get("kpt_shape"))
    return ModelMeta(
        names=parse_names(metadata),
        task=metadata.get("task") or None,
        imgsz=_imgsz(metadata.get("imgsz")),
        kpt_shape=(kpt[0], kpt[1]) if kpt is not None and len(kpt) == 2 else None,
        end2end=end2end,
        rtdetr="rtdetr" in metadata.get("description", "").lower().replace("-", ""),
        ultralytics="ultralytics" in metadata.get("author", "").lower(),
    )


def parse_names(metadata: Mapping[str, str]) -> list[str] | None:
    """The class names of ``metadata['names']`` (a dict of id -> name, or a list), by id.

    Raises:
        ConfigError: the value is not such a table, or its ids are not 0..n-1.
    """
    raw = metadata.get("names")
    if raw is None:
        return None
    value = _literal(raw)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    try:
        if not isinstance(value, dict):
            raise ValueError
        table = {int(k): str(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"the model's metadata 'names' is not a class-id -> name table: "
                          f"{raw[:80]!r}; give the task's labels explicitly") from None
    if sorted(table) != list(range(len(table))):
        raise ConfigError(f"the model's metadata 'names' has class ids {sorted(table)[:10]}..., "
                          "not 0..n-1; give the task's labels explicitly")
    return [table[i] for i in range(len(table))]


def _literal(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _flag(raw: str | None) -> bool | None:
    if raw is None:
        return None
    return raw.strip().lower() in ("true", "1", "yes")


def _ints(raw: str | None) -> list[int] | None:
    value = _literal(raw)
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _imgsz(raw: str | None) -> tuple[int, int] | None:
    value = _ints(raw)
    if value is None or len(value) > 2:
        return None
    h, w = (value[0], value[0]) if len(value) == 1 else value  # Ultralytics writes [h, w]
    return w, h
