"""Capture processes started before the daemon imports its data plane.

``edgeinfer run`` calls `start_captures` as soon as the config is valid, before it imports the
daemon (about half a second of imports here, more on a Pi) and loads the models. A camera's
capture process (``sources/isolated.py``) then starts its interpreter and imports its reader
meanwhile, and only waits to be told to open the camera, which the pipeline does when it
starts: the first result comes no later than with the camera read in the daemon's own thread.
Nothing is opened here, so a daemon that then refuses to start (its state directory is held by
another) has touched no camera; `Daemon` discards what it did not use.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import Config
from ..config.sources import CameraSource as CameraConfig
from ..errors import EdgeInferError
from ..sources import Source, discard, open_source
from ..sources.cameras import capture_in_process

__all__ = ["Early", "release", "start_captures"]

logger = logging.getLogger(__name__)

Early = dict[str, tuple[Any, Source]]  # pipeline name -> (the source config it was built for, it)


def start_captures(config: Config) -> Early:
    """The source of every pipeline whose camera is read in a capture process, built (so its
    process starts) but not entered. A source that cannot be built is left to the daemon,
    which builds it again and reports why in its words."""
    early: Early = {}
    for pc in config.pipelines:
        source = pc.source
        if not isinstance(source, CameraConfig) or capture_in_process(source):
            continue
        try:
            early[pc.name] = (source, open_source(source))
        except EdgeInferError as exc:
            logger.debug("pipeline %s: its capture process is left to the daemon: %s",
                         pc.name, exc)
    return early


def release(early: Early) -> None:
    """End the capture processes of ``early`` (a start refused before the daemon took them)."""
    while early:
        discard(early.popitem()[1][1])
