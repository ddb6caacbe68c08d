"""``serial``: a line-based sensor on a tty (CSV or JSON per line) through pyserial, windowed.

A line that does not parse, or has the wrong number of values, is counted corrupt and skipped.
A device that disappears (unplugged USB adapter) is reopened with backoff; the partial window
and partial line from before are dropped, as the readings around the gap are not contiguous.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from ..config.pipeline import SerialSource as SerialConfig
from ..errors import SourceError
from ..frames import Frame
from ._window import ReadingParser, SeriesWindows
from .base import Backoff, Source

__all__ = ["SerialSource"]

logger = logging.getLogger(__name__)

_READ_TIMEOUT_S = 0.1  # how long a read waits before it looks at stop()
_MAX_LINE = 4096  # bytes without a newline: not a line-based sensor (or the wrong baud rate)


def _pyserial() -> ModuleType:
    try:
        return importlib.import_module("serial")
    except ImportError as exc:
        raise SourceError(
            "the serial source needs pyserial: pip install 'edgeinfer[serial]'") from exc


class SerialSource(Source):
    """Windows of ``window`` readings (``window x len(fields)`` float32), ``hop`` apart.

    ``port`` is anything ``serial.serial_for_url`` opens: a device path, or a URL such as
    ``socket://host:port`` or ``rfc2217://...``. Frames are ``kind="series"`` with ``fields`` and
    ``start``, the seconds since the source opened at which the window's first reading arrived.

    Args:
        config: The ``serial`` source config.
        **context: Ignored (what other sources need).
    """

    paced_by_data = True  # a quiet topic/line is not a stall

    def __init__(self, config: SerialConfig, **context: Any) -> None:
        super().__init__(config)
        self._parser = ReadingParser(config.format, config.fields)
        self._windows: SeriesWindows | None = None
        self._serial: Any = None
        self._module: ModuleType | None = None
        self._t0 = 0.0
        self._index = 0

    @property
    def name(self) -> str:
        return str(self.config.port)

    def _open(self) -> None:
        self._module = _pyserial()
        self._t0 = time.monotonic()
        if self.config.fields:
            self._windows = SeriesWindows(self.config.window, self.config.hop,
                                          len(self.config.fields))
        error = self._connect()
        if error:
            self._fail(error)

    def _frames(self) -> Iterator[Frame]:
        c, parser, stats = self.config, self._parser, self.stats
        backoff = Backoff(c.reconnect, self._stop)
        buf = bytearray()
        while not self._stop.is_set():
            if self._serial is None:
                if not backoff.wait():
                    if self._stop.is_set():
                        return
                    raise SourceError(f"serial port {c.port}: failed {backoff.attempts + 1} times "
                                      f"in a row; last: {stats.last_error}")
                stats.reconnects += 1
                error = self._connect()
                if error:
                    self._fail(error)
                    continue
                buf.clear()
                if self._windows is not None:
                    self._windows.reset()
            try:
                data = self._serial.read(max(1, self._serial.in_waiting))
            except (OSError, self._module.SerialException) as exc:  # type: ignore[union-attr]
                self._fail(f"read failed: {exc}")
                self._disconnect()
                if buf:
                    stats.corrupt += 1  # the line cut off by the disconnect
                continue
            if not data:
                continue
            now = time.monotonic()
            buf += data
            while (nl := buf.find(b"\n")) >= 0:
                line = bytes(buf[:nl]).strip()
                del buf[:nl + 1]
                if not line:
                    continue
                values = parser.parse(line)
                if values is None:
                    stats.corrupt += 1
                    continue
                backoff.attempts = 0
                if self._windows is None:
                    self._windows = SeriesWindows(c.window, c.hop, len(parser.fields))
                done = self._windows.push(values, now)
                if done is not None:
                    stats.frames += 1
                    yield Frame(self._index, now, time.time(), done[0], "series",
                                fields=parser.fields, start=done[1] - self._t0)
                    self._index += 1
            if len(buf) > _MAX_LINE:
                stats.corrupt += 1
                buf.clear()

    def _close(self) -> None:
        self._disconnect()

    def _connect(self) -> str:
        """Open the port; ``""`` on success, else why not."""
        assert self._module is not None
        try:
            self._serial = self._module.serial_for_url(
                self.config.port, baudrate=self.config.baudrate, timeout=_READ_TIMEOUT_S)
        except (OSError, ValueError, self._module.SerialException) as exc:
            return f"cannot open: {exc}"
        return ""

    def _disconnect(self) -> None:
        ser, self._serial = self._serial, None
        if ser is not None:
            try:
                ser.close()
            except (OSError, self._module.SerialException):  # type: ignore[union-attr]
                pass  # already gone with the device

    def _fail(self, error: str) -> None:
        self.stats.errors += 1
        self.stats.last_error = error
        logger.warning("serial port %s: %s", self.config.port, error)
