"""What a model file's metadata says about its outputs: Ultralytics' ``names``, ``task``,
``imgsz``, ``kpt_shape``, ``end2end`` (ONNX ``metadata_props``, or the ``metadata.json`` an
Ultralytics TFLite export packs), read safely (``ast.literal_eval``, never ``eval``).

Values arrive as strings: Python literals from the ONNX export (``{0: 'person', ...}``), JSON
from the TFLite one (``{"0": "person"}``); both parse here, once per distinct value (a model
load asks many times: every decoder's ``matches``), and only within ``METADATA_LIMITS``: a
longer value is refused with ``ModelFormatError`` before it is parsed (a 2 MB ``kpt_shape`` is a
parse bomb, not a keypoint shape).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, ModelFormatError

__all__ = ["METADATA_LIMITS", "ModelMeta", "parse_names", "read_meta"]

METADATA_LIMITS: dict[str, tuple[int, str]] = {
    "names": (128 * 1024, "a class table; ImageNet's 1,000 names take about 30 KiB"),
    "args": (16 * 1024, "the export's arguments"),
    "kpt_shape": (64, "a keypoint shape such as [17, 3]"),
    "imgsz": (64, "an input size such as [640, 640]"),
    "end2end": (16, "a flag"),
    "task": (64, "a task name"),
    "description": (4096, "a line of text"),
    "author": (4096, "a line of text"),
}
"""The longest value read of each metadata key (characters), and what such a value is."""

_KEYS = tuple(METADATA_LIMITS)

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
        kpt_shape_text: The ``kpt_shape`` value as written, when there is one (also when it is
            not two integers, so that a pose decoder can refuse it by its words).
        end2end: The export has its NMS-free head (``[1, K, 6]`` rows).
        rtdetr: The description names RT-DETR.
        ultralytics: Written by Ultralytics.
    """

    names: list[str] | None = None
    task: str | None = None
    imgsz: tuple[int, int] | None = None
    kpt_shape: tuple[int, int] | None = None
    kpt_shape_text: str | None = None
    end2end: bool | None = None
    rtdetr: bool = False
    ultralytics: bool = False


def read_meta(metadata: Mapping[str, str]) -> ModelMeta:
    """The facts in ``metadata`` (parsed once per distinct set of values).

    Raises:
        ModelFormatError: a value is longer than ``METADATA_LIMITS`` allows.
        ConfigError: ``names`` is there but not a class-id -> name table.
    """
    meta = _read_meta(_bounded(metadata))
    return meta if meta.names is None else dataclasses.replace(meta, names=list(meta.names))


def parse_names(metadata: Mapping[str, str]) -> list[str] | None:
    """The class names of ``metadata['names']`` (a dict of id -> name, or a list), by id.

    Raises:
        ModelFormatError: the value is longer than ``METADATA_LIMITS`` allows.
        ConfigError: the value is not such a table, or its ids are not 0..n-1.
    """
    raw = _bounded(metadata, ("names",))[0]
    if raw is None:
        return None
    return list(_names(raw))


def _bounded(metadata: Mapping[str, str], keys: tuple[str, ...] = _KEYS
             ) -> tuple[str | None, ...]:
    """The values of ``keys``, each refused before any parsing when it is over its limit."""
    values = []
    for key in keys:
        raw = metadata.get(key)
        if raw is not None:
            limit, what = METADATA_LIMITS[key]
            if not isinstance(raw, str):
                raise ModelFormatError(f"the model's metadata '{key}' is a {type(raw).__name__}, "
                                       "not text")
            if len(raw) > limit:
                raise ModelFormatError(
                    f"the model's metadata '{key}' is {len(raw):,} characters long, over the "
                    f"{limit:,} read ({what}); it is refused unparsed: re-export the model, or "
                    f"remove '{key}' from its metadata")
        values.append(raw)
    return tuple(values)


@functools.lru_cache(maxsize=32)
def _read_meta(raw: tuple[str | None, ...]) -> ModelMeta:
    metadata = {k: v for k, v in zip(_KEYS, raw, strict=True) if v is not None}
    args = _literal(metadata.get("args"))
    end2end = _flag(metadata.get("end2end"))
    if end2end is None and isinstance(args, dict) and args.get("nms") is True:
        end2end = True  # `nms=True` exports end in the same [1, K, 6] rows
    kpt_text = metadata.get("kpt_shape")
    kpt = _ints(kpt_text)
    names = metadata.get("names")
    return ModelMeta(
        names=list(_names(names)) if names is not None else None,
        task=metadata.get("task") or None,
        imgsz=_imgsz(metadata.get("imgsz")),
        kpt_shape=(kpt[0], kpt[1]) if kpt is not None and len(kpt) == 2 else None,
        kpt_shape_text=kpt_text,
        end2end=end2end,
        rtdetr="rtdetr" in metadata.get("description", "").lower().replace("-", ""),
        ultralytics="ultralytics" in metadata.get("author", "").lower(),
    )


@functools.lru_cache(maxsize=32)
def _names(raw: str) -> tuple[str, ...]:
    value = _literal(raw)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    try:
        if not isinstance(value, dict):
            raise ValueError
        table = {int(k): str(v) for k, v in value.items()}
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"the model's metadata 'names' is not a class-id -> name table: "
                          f"{raw[:80]!r}; give the task's labels explicitly") from None
    if sorted(table) != list(range(len(table))):
        raise ConfigError(f"the model's metadata 'names' has class ids {sorted(table)[:10]}..., "
                          "not 0..n-1; give the task's labels explicitly")
    return tuple(table[i] for i in range(len(table)))


def _literal(raw: str | None) -> Any:
    if raw is None:
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None  # ``{[1]: 'a'}`` is a TypeError (a list as a key)


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
