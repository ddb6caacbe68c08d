"""The accuracy gate a backend candidate must pass: its outputs against the fp32 reference's.

``OutputsGate`` is the gate for any model (every output close); the tasks bring their own
(``tasks/gates.py``: the same detections, the same top-1 class).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .base import TensorSpec


class Gate(Protocol):
    """Decides whether a candidate's outputs are the reference's, for one kind of task.

    ``key`` names the gate in the decision cache. ``sample_feeds`` gives real inputs for the
    model (preprocessed sample photos for a detector); an empty list means made-up inputs.
    ``compare`` returns ``(why rejected or "", a short accuracy note)``.
    """

    @property
    def key(self) -> str: ...

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]: ...

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]: ...


MAX_WIDENED = (0.99, 0.1)  # the loosest a calibrated outputs gate gets: cosine, error/range
ATOL = 1e-6  # the noise floor: below atol x max(1, |largest reference value|), any error passes

Feeder = Callable[[Sequence[TensorSpec]], list[dict[str, np.ndarray]]]
"""Makes sample inputs for a model's inputs (``model/samples.py``: photographs preprocessed as
the model will see them); an empty list: none fit."""


@dataclass(frozen=True, slots=True)
class OutputsGate:
    """Every output close to the reference (float outputs): an error under the noise floor
    (``atol`` x max(1, the reference's largest magnitude): float32 rounding, whatever the
    cosine says of values that are all near zero) passes; above it, cosine >= ``cosine`` and
    the largest error at most ``rel_range`` of the reference's value range. Integer and boolean
    outputs equal; shapes equal. The gate for models whose task is not known.

    ``feeder`` gives the inputs to judge on (``sample_feeds``); ``samples`` says what they are
    (``"sample photos"``). Without one, the selector makes up inputs."""

    cosine: float = 0.9999
    rel_range: float = 1e-3
    key: str = "outputs"
    atol: float = ATOL
    feeder: Feeder | None = field(default=None, compare=False, repr=False)
    samples: str = "sample inputs"

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        return self.feeder(inputs) if self.feeder is not None else []

    def calibrate(self, reference: Sequence[Mapping[str, np.ndarray]],
                  other: Sequence[Mapping[str, np.ndarray]]) -> OutputsGate:
        """This gate, its tolerance widened to twice the disagreement of ``other`` (a second
        fp32 configuration) with ``reference``, up to ``MAX_WIDENED`` (cosine >= 0.99, error
        <= 10 % of the range) and no further."""
        worst_cos, worst_rel = 1.0, 0.0
        for ref, got in zip(reference, other):
            for name, r in ref.items():
                _, cos, rel = compare_arrays(name, r, got.get(name), 0.0, math.inf, self.atol)
                worst_cos, worst_rel = min(worst_cos, cos), max(worst_rel, rel)
        cosine = max(MAX_WIDENED[0], min(self.cosine, 1 - 2 * (1 - worst_cos)))
        rel_range = min(MAX_WIDENED[1], max(self.rel_range, 2 * worst_rel))
        if (cosine, rel_range) == (self.cosine, self.rel_range):
            return self
        return dataclasses.replace(self, cosine=cosine, rel_range=rel_range)

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]:
        worst_cos, worst_rel = 1.0, 0.0
        for ref, got in zip(reference, outputs):
            for name, r in ref.items():
                why, cos, rel = compare_arrays(name, r, got.get(name), self.cosine,
                                               self.rel_range, self.atol)
                if why:
                    return why, f"cosine {cos:.6f}, error/range {rel:.2g}"
                worst_cos, worst_rel = min(worst_cos, cos), max(worst_rel, rel)
        return "", f"cosine {worst_cos:.6f}, error/range {worst_rel:.2g}"


def compare_arrays(name: str, ref: np.ndarray, got: Any, min_cosine: float,
                   max_rel: float, atol: float = 0.0) -> tuple[str, float, float]:
    """``(why it fails or "", cosine, max error relative to the reference's range)``.

    An error no larger than ``atol`` x max(1, the reference's largest magnitude) is float32
    rounding: the arrays count as equal (``("", 1.0, 0.0)``) whatever the cosine and the range
    would say (of values all near zero, both are noise: cosine 0.43 between two fp32 kernels on
    a text detector's empty probability map, all under 1e-7)."""
    if not isinstance(got, np.ndarray):
        return f"output {name!r} missing", 0.0, math.inf
    r = np.asarray(ref)
    if got.shape != r.shape:
        return f"output {name!r} has shape {got.shape}, the reference {r.shape}", 0.0, math.inf
    if r.dtype.kind not in "fc":
        if r.dtype.kind == "O" or got.dtype.kind == "O":
            same = bool(np.array_equal(r.astype(str), got.astype(str)))
        else:
            same = bool(np.array_equal(r, got))
        return ("" if same else f"output {name!r} differs from the reference"), \
            (1.0 if same else 0.0), (0.0 if same else math.inf)
    if r.size == 0:
        return "", 1.0, 0.0
    a = np.asarray(r, dtype=np.float64).ravel()
    b = np.asarray(got, dtype=np.float64).ravel()
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite]):
        return f"output {name!r} has NaN/inf where the reference has not", 0.0, math.inf
    a, b = a[finite], b[finite]
    if a.size == 0:
        return "", 1.0, 0.0
    err = float(np.max(np.abs(a - b)))
    if err <= atol * max(1.0, float(np.max(np.abs(a)))):
        return "", 1.0, 0.0
    span = float(np.max(a) - np.min(a))
    rel = err / span if span > 0 else (0.0 if err == 0 else err / max(float(np.max(np.abs(a))),
                                                                       1e-12))
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 and nb == 0:
        cos = 1.0
    elif na == 0 or nb == 0:
        cos = 0.0
    else:
        cos = float(np.dot(a, b) / (na * nb))
    if cos < min_cosine:
        return f"output {name!r}: cosine {cos:.6f} < {min_cosine}", cos, rel
    if rel > max_rel:
        return f"output {name!r}: max error {err:.3g} is {rel:.2g} of its range (> {max_rel:g})", \
            cos, rel
    return "", cos, rel
