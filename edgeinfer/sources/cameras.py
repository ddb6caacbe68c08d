"""Which implementation reads a ``camera`` source: PyAV (``sources/rtsp.py``) for RTSP streams
when it is installed, or when asked (``backend: pyav``, ``detect_uri``, ``transport``); OpenCV
(``sources/camera.py``) for the rest: V4L2 devices, HTTP MJPEG, GStreamer pipelines, and RTSP
without PyAV (clips are then re-encoded from decoded frames).

Either runs in a capture process of its own by default (``isolation``, ``sources/isolated.py``).

PyAV is the ``rtsp`` extra (``pip install 'edgeinfer[rtsp]'``): its wheels bundle FFmpeg
(about 35 MB on x86_64 and aarch64), so it is not a default dependency.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from functools import cache
from typing import Any

from .._importer import resolve
from ..config.sources import CameraSource as CameraConfig
from ..errors import SourceError
from .base import Source

__all__ = ["CAMERA_READERS", "camera_reader", "capture_in_process", "open_camera",
           "pyav_available"]

logger = logging.getLogger("edgeinfer.sources.camera")

CAMERA_READERS = {
    "pyav": "edgeinfer.sources.rtsp:PyAvSource",
    "opencv": "edgeinfer.sources.camera:CameraSource",
}

_ISOLATED = {"process": "edgeinfer.sources.isolated:ProcessSource"}
_INSTALL = "pip install 'edgeinfer[rtsp]'"


@cache
def pyav_available() -> bool:
    """Whether PyAV (``import av``) is installed."""
    return importlib.util.find_spec("av") is not None


def camera_reader(config: CameraConfig) -> str:
    """``pyav`` or ``opencv`` for ``config``.

    Raises:
        SourceError: the config needs PyAV (``backend: pyav``, ``detect_uri``, ``transport``)
            and it is not installed.
    """
    uri = config.uri
    rtsp = isinstance(uri, str) and uri.lower().startswith(("rtsp://", "rtsps://"))
    needs = ("backend: pyav" if config.backend == "pyav"
             else "detect_uri" if config.detect_uri is not None
             else f"transport: {config.transport}" if config.transport != "auto"
             else f"decoder: {config.decoder}" if config.decoder not in ("auto", "software")
             else None)
    if needs is not None:
        if not pyav_available():
            raise SourceError(f"camera: {needs} needs PyAV, which is not installed: {_INSTALL}")
        return "pyav"
    if config.backend == "auto" and rtsp:
        if pyav_available():
            return "pyav"
        logger.info("camera: PyAV is not installed, so RTSP goes through OpenCV and event clips "
                    "are re-encoded; %s keeps the camera's own packets for clips", _INSTALL)
    return "opencv"


def capture_in_process(config: CameraConfig) -> bool:
    """Whether the camera is read in a thread of the pipeline's process (``isolation``)."""
    if config.isolation == "auto":
        return os.environ.get("EDGEINFER_CAPTURE_IN_PROCESS", "") not in ("", "0")
    return config.isolation == "thread"


def open_camera(config: CameraConfig, **context: Any) -> Source:
    """The source for a ``camera`` config (see the module): read in a capture process of its
    own (``isolated.py``) unless ``isolation`` says otherwise."""
    reader = camera_reader(config)
    if not capture_in_process(config):
        isolated = resolve(_ISOLATED, "process", "camera isolation")
        source: Source = isolated(config, reader, **context)
        return source
    cls = resolve(CAMERA_READERS, reader, "camera reader")
    source = cls(config, **context)
    return source
