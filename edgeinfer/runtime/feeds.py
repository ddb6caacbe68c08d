"""The inputs the backend selector runs its candidates on: the gate's samples (preprocessed
sample photos for a detector, photos as the model will see them from ``load_model``), else
seeded random values, else zeros. Never on a guessed size: an input whose dimension past the
batch is dynamic and not fixed by ``input_shapes`` is not measured at all (a ``1x3x1x1`` image
measures nothing the model will run, and refuses backends for outputs such as ``(0, 2)``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import EdgeInferError, InvalidInputError
from .base import Dim, Session, SessionSpec, TensorSpec, warmup_feeds
from .gate import Gate

__all__ = ["dims", "measure_feeds", "unknown_sizes"]

logger = logging.getLogger("edgeinfer.runtime.select")  # its messages were select's: kept


def measure_feeds(spec: SessionSpec, gate: Gate, ref: Session
                  ) -> tuple[list[dict[str, np.ndarray]] | None, str]:
    """The inputs candidates are run on, and a note saying what they are and at which shape:
    the gate's samples, else seeded random values (zeros where the model refuses those);
    None: none can be made, or a size would have to be guessed (the note says what to pass)."""
    try:
        samples = gate.sample_feeds(ref.inputs)
    except EdgeInferError as exc:
        logger.info("no sample inputs for %s (%s); using made-up ones", spec.path.name, exc)
        samples = []
    if samples:
        what = getattr(gate, "samples", "sample inputs")
        return samples, f"{len(samples)} {what} at {_shapes(samples[0], spec)}"
    unknown = unknown_sizes(ref.inputs, spec.input_shapes)
    if unknown:
        return None, unknown
    try:
        base, _ = warmup_feeds(ref.inputs, spec.input_shapes, spec.warmup_inputs)
    except InvalidInputError as exc:
        return None, f"no input can be made up ({exc})"
    rng = np.random.default_rng(0)
    feeds = {n: rng.random(v.shape, dtype=np.float32).astype(v.dtype)
             if v.dtype.kind == "f" and n not in spec.warmup_inputs else v
             for n, v in base.items()}
    try:
        ref.run(feeds)
    except EdgeInferError:  # random values refused (a Reshape shape...): zeros as the warm-up
        try:
            ref.run(base)
        except EdgeInferError as exc:
            return None, f"the model refused made-up inputs ({str(exc)[:160]})"
        return [base], f"made-up inputs (zeros) at {_shapes(base, spec)}"
    return [feeds], f"seeded random inputs at {_shapes(feeds, spec)}"


def unknown_sizes(inputs: Sequence[TensorSpec], fixed: Mapping[str, tuple[int, ...]]) -> str:
    """"" when every input's size is known (declared, or in ``fixed``; a dynamic leading
    batch dimension counts as 1); otherwise which inputs are not, and what to pass."""
    unknown = [s for s in inputs if s.name not in fixed
               and any(not (isinstance(d, int) and d >= 0) for d in s.shape[1:])]
    if not unknown:
        return ""
    example = {s.name: [d if isinstance(d, int) and d >= 0 else ("1" if i == 0 else "N")
                        for i, d in enumerate(s.shape)] for s in unknown}
    api = ", ".join(f"{n!r}: [{', '.join(map(str, dims))}]" for n, dims in example.items())
    flags = " ".join(f"--input-shape {n}={'x'.join(map(str, dims))}"
                     for n, dims in example.items())
    what = ", ".join(f"{s.name} {dims(s.shape)}" for s in unknown)
    return (f"the size of {what} is not known, and none is guessed: give the size it runs at, "
            f"{flags} (Python: input_shapes={{{api}}})")


def dims(shape: Sequence[Dim]) -> str:
    """``1x3x640x640``; ``?`` for a dynamic dimension (``?x3x?x?``)."""
    return "x".join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in shape) or "scalar"


def _shapes(feeds: Mapping[str, np.ndarray], spec: SessionSpec) -> str:
    """``x 1x3x640x640 (size from ...)``: the shapes measured on and where they came from."""
    shapes = ", ".join(f"{n} {dims(v.shape)}" for n, v in feeds.items())
    return f"{shapes} (size from {spec.input_shapes_from})" if spec.input_shapes_from else shapes
