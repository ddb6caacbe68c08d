"""OpenCV's own log lines (``[ WARN:0@0.023] global cap_v4l.cpp:914 open VIDEOIO(V4L2:...)``)
are for OpenCV's developers: edgeinfer reports what failed in its own words (a ``SourceError``
naming the device or file). Called by the modules that open captures and decode images, when
they are imported, so ``edgeinfer --help`` still imports no cv2."""

from __future__ import annotations

import functools
import os

__all__ = ["quiet_opencv"]


@functools.cache
def quiet_opencv() -> None:
    """Errors only, unless the user set ``OPENCV_LOG_LEVEL`` (then OpenCV follows it)."""
    if os.environ.get("OPENCV_LOG_LEVEL"):
        return
    import cv2

    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
