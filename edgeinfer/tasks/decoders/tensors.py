"""What the decoders of post-processed layouts share: outputs found by name or by shape (exports
reorder them), integer outputs read with their scale and zero point, and class ids lined up
with labels that start with a background entry."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ...runtime.base import TensorSpec

__all__ = ["Quant", "dequantized", "is_count", "label_shift", "named", "quant_of"]

Quant = tuple[float, int] | None

# A labels list whose first entry is one of these is indexed by category id (0: background).
BACKGROUND = frozenset({"???", "background", "__background__", "bg", "n/a"})


def named(outputs: Sequence[TensorSpec], fragment: str) -> TensorSpec | None:
    """The one output whose name contains ``fragment`` (case aside; ``raw_`` outputs, the
    TF Object Detection API's pre-NMS ones, never count), else ``None``."""
    hits = [s for s in outputs
            if fragment in s.name.lower() and "raw_" not in s.name.lower()]
    return hits[0] if len(hits) == 1 else None


def is_count(spec: TensorSpec) -> bool:
    """A detection count: one value (``[1]``, ``[1, 1]`` or a scalar)."""
    return len(spec.shape) <= 2 and all(d == 1 for d in spec.shape)


def quant_of(spec: TensorSpec) -> Quant:
    """``(scale, zero_point)`` to read an integer output with, where the model gives one."""
    return spec.quantization if np.dtype(spec.dtype).kind in "iu" else None


def dequantized(values: np.ndarray, quant: Quant) -> np.ndarray:
    """``values`` as float32: ``(q - zero_point) * scale`` for integers a session returned
    raw (sessions dequantize by default; then this is a no-op)."""
    if quant is None or values.dtype.kind not in "iu":
        return values
    out: np.ndarray = np.subtract(values, quant[1], dtype=np.float32)
    out *= np.float32(quant[0])
    return out


def label_shift(first_id: int, names: Sequence[str] | None) -> int:
    """What to add to a model's class ids so that they index ``names``.

    ``first_id`` is the id of the model's first real class: 0 for TFLite's post-processing op,
    1 for the TF Object Detection API (COCO category ids). Labels that start with a background
    entry (``coco91``, a ``???`` first line) are indexed by category id, others from their
    first class; without labels the model's ids are kept.
    """
    if not names:
        return 0
    return (1 if names[0].strip().lower() in BACKGROUND else 0) - first_id
