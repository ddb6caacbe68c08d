"""The inputs the backend selector runs its candidates on: the gate's samples (preprocessed
sample photos for a detector), else seeded random values, else zeros."""

from __future__ import annotations

import logging

import numpy as np

from ..errors import EdgeInferError, InvalidInputError
from .base import Session, SessionSpec, warmup_feeds
from .gate import Gate

__all__ = ["measure_feeds"]

logger = logging.getLogger("edgeinfer.runtime.select")  # its messages were select's: kept


def measure_feeds(spec: SessionSpec, gate: Gate, ref: Session
                  ) -> tuple[list[dict[str, np.ndarray]] | None, str]:
    """The inputs candidates are run on, and a note saying what they are: the gate's samples,
    else seeded random values (zeros where the model refuses those); None: none can be made."""
    try:
        samples = gate.sample_feeds(ref.inputs)
    except EdgeInferError as exc:
        logger.info("no sample inputs for %s (%s); using made-up ones", spec.path.name, exc)
        samples = []
    if samples:
        return samples, f"{len(samples)} sample input{'s' if len(samples) != 1 else ''}"
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
        return [base], "made-up inputs (zeros)"
    return [feeds], "seeded random inputs"
