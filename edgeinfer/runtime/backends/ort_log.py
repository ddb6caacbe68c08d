"""onnxruntime's own log output while its Python tooling runs (quantizers, pre-processing).

onnxruntime's quantization tools warn through the *root* logger (``logging.warning``: opset
advice, "please use QDQ") and the sessions they create log C++ warnings to stderr: advice to
its API's callers, not to ours. Here, by the runtime layer that uses the tools (dynamic int8
candidates) as well as by ``edgeinfer quantize``, it is kept at debug level under the caller's
logger.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

__all__ = ["onnxruntime_quiet"]


class _FromOnnxruntime(logging.Filter):
    """Moves records made by onnxruntime's Python code to ``into`` at debug level."""

    def __init__(self, into: logging.Logger) -> None:
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        if f"{os.sep}onnxruntime{os.sep}" not in record.pathname:
            return True
        self.into.debug("onnxruntime: %s", record.getMessage())
        return False


@contextlib.contextmanager
def onnxruntime_quiet(into: logging.Logger) -> Iterator[None]:
    """While inside: onnxruntime's Python warnings go to ``into`` at debug level, and its native
    log says only errors (everything, when ``into`` logs debug)."""
    import onnxruntime as ort

    root, quiet = logging.getLogger(), _FromOnnxruntime(into)
    root.addFilter(quiet)
    ort.set_default_logger_severity(1 if into.isEnabledFor(logging.DEBUG) else 3)
    try:
        yield
    finally:
        ort.set_default_logger_severity(2)
        root.removeFilter(quiet)
