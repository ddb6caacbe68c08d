"""The crash test hook of a model update: ``EDGEINFER_OTA_CRASH_AT=<point>`` kills the daemon with
SIGKILL at that point of a transfer or an update (``chunk``, ``verify``, ``store``, ``link``,
``swap``, ``gate``), so the tests can show that every point recovers at the next start."""

from __future__ import annotations

import logging
import os
import signal

__all__ = ["CRASH_ENV", "crash_point"]

logger = logging.getLogger("edgeinfer.ota.agent")  # where this line was always logged

CRASH_ENV = "EDGEINFER_OTA_CRASH_AT"


def crash_point(name: str) -> None:
    """Test hook: SIGKILL this process at ``name`` when ``EDGEINFER_OTA_CRASH_AT`` says so."""
    if os.environ.get(CRASH_ENV) == name:
        logger.warning("%s=%s: killing the daemon here (crash test)", CRASH_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)
