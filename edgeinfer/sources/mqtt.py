"""``mqtt``: sensor readings arriving as JSON on a topic, windowed like a serial sensor.

The source does not own an MQTT connection: the pipeline passes ``subscribe``, a callable of
the daemon's client (``subscribe(topic, qos, on_payload) -> unsubscribe``), so one connection
serves every pipeline and reconnecting is the client's business. Payloads are only queued in
the client's network thread; parsing and windowing happen in the source's own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ..config.pipeline import MqttSource as MqttConfig
from ..errors import SourceError
from ..frames import Frame
from ._window import ReadingParser, SeriesWindows
from .base import Source

__all__ = ["MqttSource", "Subscribe"]

logger = logging.getLogger(__name__)

Subscribe = Callable[[str, int, Callable[[bytes], None]], Callable[[], None]]
"""``subscribe(topic, qos, on_payload) -> unsubscribe``, as the MQTT client provides it."""

_WAIT_S = 0.5  # an idle wait; stop() wakes it at once anyway


class MqttSource(Source):
    """Windows of ``window`` readings (``window x len(fields)`` float32), ``hop`` apart, from
    JSON payloads on ``topic``: an object (the ``fields`` keys, in order), an array of numbers,
    or one number. A payload that does not parse or lacks a field is counted corrupt.

    Readings wait in a queue of ``queue_size``; when the pipeline falls behind the oldest are
    dropped and counted as ``skipped``. Frames are ``kind="series"`` with ``fields`` and
    ``start``, the seconds since the source opened at which the window's first reading arrived.

    Args:
        config: The ``mqtt`` source config.
        subscribe: The MQTT client's subscribe callable (the ``mqtt:`` section of the config).
        queue_size: Readings kept while the pipeline is busy (default: 1024, at least 2 windows).
        **context: Ignored (what other sources need).
    """

    paced_by_data = True  # a quiet topic/line is not a stall

    def __init__(self, config: MqttConfig, subscribe: Subscribe | None = None,
                 queue_size: int | None = None, **context: Any) -> None:
        super().__init__(config)
        self._subscribe = subscribe
        self._queue: deque[tuple[bytes, float]] = deque()
        self._queue_size = queue_size or max(1024, 2 * config.window)
        self._cond = threading.Condition()
        self._unsubscribe: Callable[[], None] | None = None
        self._parser = ReadingParser("json", config.fields)
        self._windows: SeriesWindows | None = None
        self._t0 = 0.0
        self._index = 0

    @property
    def name(self) -> str:
        return f"mqtt:{self.config.topic}"

    def stop(self) -> None:
        super().stop()
        with self._cond:
            self._cond.notify_all()

    def _open(self) -> None:
        if self._subscribe is None:
            raise SourceError(f"an mqtt source needs the mqtt: section (broker) to subscribe "
                              f"to {self.config.topic!r}")
        self._t0 = time.monotonic()
        self._unsubscribe = self._subscribe(self.config.topic, self.config.qos, self._on_payload)

    def _on_payload(self, payload: bytes) -> None:
        # The client's network thread: queue and return.
        with self._cond:
            if len(self._queue) >= self._queue_size:
                self._queue.popleft()
                self.stats.skipped += 1
            self._queue.append((payload, time.monotonic()))
            self._cond.notify()

    def _frames(self) -> Iterator[Frame]:
        c, parser, stats, queue = self.config, self._parser, self.stats, self._queue
        while True:
            with self._cond:
                while not queue and not self._stop.is_set():
                    self._cond.wait(_WAIT_S)
                if self._stop.is_set():
                    return
                batch = list(queue)
                queue.clear()
            for payload, t in batch:
                values = parser.parse(payload)
                if values is None:
                    stats.corrupt += 1
                    continue
                if self._windows is None:
                    self._windows = SeriesWindows(c.window, c.hop, len(parser.fields))
                done = self._windows.push(values, t)
                if done is not None:
                    stats.frames += 1
                    yield Frame(self._index, t, time.time(), done[0], "series",
                                fields=parser.fields, start=done[1] - self._t0)
                    self._index += 1

    def _close(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            try:
                unsubscribe()
            except Exception as exc:  # the client may already be down; nothing to undo then
                logger.debug("mqtt source %s: unsubscribe failed: %s", self.config.topic, exc)
        with self._cond:
            self._queue.clear()
