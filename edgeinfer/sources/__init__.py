"""Sources: one module per family, chosen by the config's ``type:`` through a lazy registry, so
OpenCV, PyAV, picamera2 or pyserial are imported only by the pipelines that use them."""

from __future__ import annotations

import logging
from typing import Any

from .._importer import resolve
from .base import Backoff, RateLimiter, Source, SourceStats

SOURCES = {
    "camera": "edgeinfer.sources.cameras:open_camera",
    "picamera2": "edgeinfer.sources.picamera:Picamera2Source",
    "video": "edgeinfer.sources.isolated:open_video",
    "images": "edgeinfer.sources.files:ImagesSource",
    "synthetic": "edgeinfer.sources.synthetic:SyntheticSource",
    "audio": "edgeinfer.sources.audio:AudioSource",
    "serial": "edgeinfer.sources.serial:SerialSource",
    "mqtt": "edgeinfer.sources.mqtt:MqttSource",
}

__all__ = ["SOURCES", "Backoff", "RateLimiter", "Source", "SourceStats", "discard", "open_source"]

logger = logging.getLogger(__name__)


def open_source(config: Any, **context: Any) -> Source:
    """Build (not yet enter) the source for a source config struct (its ``type`` tag).

    ``context`` carries what some sources need besides their config (the MQTT client for
    ``mqtt``); each source takes what it knows and ignores the rest.
    """
    tag = type(config).__struct_config__.tag
    cls = resolve(SOURCES, tag, "source type")
    source: Source = cls(config, **context)
    return source


def discard(source: Source) -> None:
    """Release a source built for a pipeline that was not built or never started."""
    try:
        source.__exit__(None, None, None)
    except Exception as exc:  # the error that stopped the build matters more
        logger.debug("releasing an unused source failed: %s", exc)
