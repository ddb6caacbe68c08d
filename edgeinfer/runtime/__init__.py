"""Runtime backends behind one ``Session`` protocol, chosen by the model's detected format.

Nothing here imports onnxruntime or LiteRT until a model of that format is opened.
"""

from __future__ import annotations

from .._importer import resolve
from .base import LoadReport, Session, SessionSpec, TensorSpec

BACKENDS = {
    "onnx": "edgeinfer.runtime.onnx:open_session",
    "tflite": "edgeinfer.runtime.tflite:open_session",
}

__all__ = ["BACKENDS", "LoadReport", "Session", "SessionSpec", "TensorSpec", "open_session"]


def open_session(spec: SessionSpec) -> Session:
    """Build, verify and warm a session in this process with the backend for ``spec.format``."""
    factory = resolve(BACKENDS, spec.format, "model format")
    session: Session = factory(spec)
    return session
