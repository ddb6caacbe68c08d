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

    # cv2.utils.logging is not there in every build (OpenCV 4.8's wheels lack it); cv2.setLogLevel
    # takes the same enum, where 2 is LOG_LEVEL_ERROR. A build with neither keeps its own level.
    log = getattr(cv2.utils, "logging", None)
    if log is not None:
        log.setLogLevel(log.LOG_LEVEL_ERROR)
    elif hasattr(cv2, "setLogLevel"):
        cv2.setLogLevel(2)
