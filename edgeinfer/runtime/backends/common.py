"""What every backend module writes alike: ``available()`` answered by its import function, the
end of a load (its time and memory in the report, the warm-up, the memory after it), and the
provider of a session, which is its load report's."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ...errors import BackendUnavailableError, ModelFormatError
from ..base import (
    LoadReport,
    Session,
    SessionSpec,
    TensorSpec,
    format_shape,
    is_tensor,
    numpy_dtype,
    warm_up,
)
from ..memory import MemoryMeter

__all__ = ["MAX_INPUT_BYTES", "BackendSession", "check_input_sizes", "finish_load", "importable"]

S = TypeVar("S", bound=Session)


class BackendSession:
    """The base of the backends' sessions (each implements ``run`` and ``close`` of the
    ``Session`` protocol itself): what they hold, and the provider their report names."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    report: LoadReport

    @property
    def provider(self) -> str:
        """What runs the model, as the load report names it: an onnxruntime execution provider,
        ``openvino-CPU``, ``xnnpack`` or a LiteRT delegate (``edgetpu``), ``armnn-CpuAcc``."""
        return self.report.provider


def importable(import_library: Callable[[], object]) -> bool:
    """Whether ``import_library()`` finds the backend's library here (it raises
    ``BackendUnavailableError`` where the library is missing)."""
    try:
        import_library()
    except BackendUnavailableError:
        return False
    return True


def finish_load(session: S, spec: SessionSpec, meter: MemoryMeter, start: float) -> S:
    """``session`` with its load time (since ``start``, a ``perf_counter``) and memory in its
    report, warmed up when ``spec.warmup`` asks, and the memory after that first run.

    Raises:
        ModelFormatError: an input declares an absurd size (:func:`check_input_sizes`).
        ModelLoadError, ModelMemoryError: see :func:`warm_up` (the session is then closed).
    """
    try:
        check_input_sizes(session.inputs, spec.path)
    except ModelFormatError:
        session.close()
        raise
    report = session.report
    report.load_ms = (time.perf_counter() - start) * 1000.0
    report.rss_load_mb = meter.added_mb()
    if spec.warmup:
        warm_up(session, spec)
    report.rss_first_run_mb = meter.added_mb()
    return session


MAX_INPUT_BYTES = 1 << 31
"""The largest one input may declare (its fixed dimensions; a dynamic one counts as 1): a
frame of 2 GiB is no model for this device, and numpy cannot make some declared sizes at all."""


def check_input_sizes(inputs: tuple[TensorSpec, ...], path: Path) -> None:
    """Refuse a model whose inputs declare more than ``MAX_INPUT_BYTES`` each.

    Raises:
        ModelFormatError: one does, named with its shape and size.
    """
    for spec in inputs:
        dtype = numpy_dtype(spec.dtype) if is_tensor(spec.dtype) else None
        size = dtype.itemsize if dtype is not None else 1
        for d in spec.shape:
            if isinstance(d, int) and d > 0:
                size *= d
        if size > MAX_INPUT_BYTES:
            raise ModelFormatError(
                f"model {path.name}: input {spec.name!r} declares {format_shape(spec.shape)} "
                f"{spec.dtype}, {size:,} bytes per run, over the {MAX_INPUT_BYTES:,} a model "
                "input may take: the export's input size is wrong; export it again at the "
                "size it runs at")
