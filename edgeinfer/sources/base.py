"""The ``Source`` interface every source family implements, and the pieces they share:
reconnect backoff, an fps cap, and counters.

A source is a context manager: entering opens it (a file that cannot be opened raises
``SourceError`` naming it; a live source whose device or stream is missing logs, counts and
retries with backoff instead), iterating yields ``Frame`` objects until the stream ends or
``stop()`` is called from another thread, and leaving releases the device.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self

from ..config.pipeline import ReconnectConfig
from ..health import Health
from .packets import PacketRing


@dataclass(slots=True)
class SourceStats:
    """Counters a source keeps; the pipeline reports them on its stats."""

    frames: int = 0  # frames yielded
    skipped: int = 0  # frames read but not yielded (over max_fps)
    corrupt: int = 0  # frames or lines that could not be decoded/parsed, skipped
    reconnects: int = 0  # times a live source reopened its device or stream
    retries: int = 0  # attempts to reopen it (each one after a failure, successful or not)
    errors: int = 0  # failures to open or read, including those that led to a reconnect
    last_error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "skipped": self.skipped, "corrupt": self.corrupt,
                "reconnects": self.reconnects, "retries": self.retries, "errors": self.errors,
                "last_error": self.last_error}


class Source(ABC):
    """One stream of frames. Subclasses set ``live`` and implement ``_open``, ``_frames`` and
    ``_close``; the base class gives the context manager, ``stop()`` and the counters.

    ``live`` sources (cameras, streams, microphones, sensors) never block the pipeline: it drops
    their oldest frame when inference falls behind. File sources are read completely: the
    pipeline blocks on them instead.
    """

    live: bool = True
    #: A sensor (an MQTT topic, a serial line) yields a frame only when data comes, and may be
    #: quiet for hours: the watchdog counts a stall only while one of its frames is in flight.
    #: A sensor that hangs inside its own read looks quiet, and is not restarted.
    paced_by_data: bool = False
    #: The camera's own encoded packets, for clips cut without re-encoding (``packets.py``):
    #: set by sources that demux a compressed stream (``rtsp.py``), ``None`` for the others.
    packets: PacketRing | None = None

    def __init__(self, config: Any) -> None:
        self.config = config
        self.stats = SourceStats()
        self._stop = threading.Event()
        self._entered = False

    @property
    def name(self) -> str:
        """What to call this source in messages (its URI, device or command)."""
        return type(self).__name__

    @property
    def waiting(self) -> bool:
        """``True`` while a live source cannot open its device or stream and is retrying: the
        pipeline is waiting for hardware (reported on stats), not stuck, so the watchdog leaves
        it alone. Sources that can tell override this."""
        return False

    def health(self) -> Health | None:
        """The source's part of its pipeline's state: ``None`` while it works (or cannot
        tell), ``no_source`` / ``reconnecting`` with the reason while a live device is out,
        ``running`` with a reason while it works but left some frames out (broken ones)."""
        return None

    def stop(self) -> None:
        """Make iteration end soon; safe from any thread."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def __enter__(self) -> Self:
        self._open()
        self._entered = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._entered = False
        self._close()

    def __iter__(self) -> Iterator[Any]:
        if not self._entered:
            from ..errors import StateError

            raise StateError(f"use the source in a `with` block before iterating ({self.name})")
        return self._frames()

    @abstractmethod
    def _open(self) -> None:
        """Open the device/file. Live sources may leave reopening to ``_frames``."""

    @abstractmethod
    def _frames(self) -> Iterator[Any]:
        """Yield ``Frame`` objects until the end or until ``stopped``."""

    @abstractmethod
    def _close(self) -> None:
        """Release everything; idempotent."""


class Outage:
    """A live device's failures: counted on the source's stats, logged in words (a warning when
    an outage starts or its reason changes, again every ``REMIND_S`` while it lasts, debug in
    between, info when the device is back), cleared by the first good frame, and a
    ``SourceError`` naming the device once ``max_attempts`` failures in a row are spent.

    Its ``health()`` is the source's part of the pipeline's state (``edgeinfer.health``):
    ``no_source`` while the device never opened, ``reconnecting`` when it was lost after."""

    __slots__ = ("_name", "_stats", "_logger", "_warned", "failures", "opened", "reason",
                 "since")

    REMIND_S = 60.0  # how often a lasting outage is logged again at warning level

    def __init__(self, name: str, stats: SourceStats, log: logging.Logger) -> None:
        self._name, self._stats, self._logger = name, stats, log
        self.failures = 0
        self.reason = ""
        self.since: float | None = None  # when the outage began; None while the device works
        self.opened = False  # the device opened at least once (reconnecting, not no_source)
        self._warned: tuple[float, str] = (0.0, "")  # when and what was last warned

    @property
    def down(self) -> bool:
        return self.since is not None

    def fail(self, reason: str) -> None:
        """Count a failure; ``reason`` in words, with the fix."""
        now = time.monotonic()
        self.failures += 1
        self.reason = reason
        self._stats.errors += 1
        self._stats.last_error = f"{self._name}: {reason}"
        if self.since is None:
            self.since = now
        when, said = self._warned
        if said != reason or now - when >= self.REMIND_S:
            self._warned = (now, reason)
            if said == reason:
                self._logger.warning("camera %s: still %s (%d retries in %.0f s); retrying "
                                     "with backoff", self._name, reason, self._stats.retries,
                                     now - self.since)
            else:
                self._logger.warning("camera %s: %s; retrying with backoff", self._name,
                                     reason)
        elif self._logger.isEnabledFor(logging.DEBUG):
            self._logger.debug("camera %s: %s (failure %d in a row)", self._name, reason,
                               self.failures)

    def pending(self, reason: str) -> None:
        """Not working yet: connecting, or connected and waiting for the first frame (a
        camera that answered but sends nothing must not read as ``running``). Shown by
        ``health()`` (``starting`` before any failure) until a good frame (`recovered`) or a
        failure; neither counted nor logged."""
        self.reason = reason
        if self.since is None:
            self.since = time.monotonic()

    def retry(self) -> None:
        """An attempt to reopen the device begins (counted on stats: ``retries``)."""
        self._stats.retries += 1

    def reopened(self, pending: str | None = None) -> None:
        """The device opened (again, after failing: not yet a good frame). ``pending``: it
        is not known to work until its first frame, and this is why (`pending`)."""
        if pending is None:
            self.opened = True
        else:
            self.pending(pending)
        if self.failures and self.since is not None:
            self._stats.reconnects += 1
            self._logger.info("camera %s: reopened after %d failures (%.1f s down)", self._name,
                              self.failures, time.monotonic() - self.since)

    def recovered(self, backoff: Backoff) -> None:
        """A good frame arrived: the outage is over."""
        self.opened = True
        if self.failures or self.since is not None:
            self.failures = 0
            self.since = None
            self._warned = (0.0, "")
            backoff.reset()

    def health(self, next_retry_at: float | None = None) -> Health | None:
        """``no_source`` / ``reconnecting`` with the reason during an outage, ``starting``
        while `pending` before any failure, else ``None``."""
        if self.since is None:
            return None
        state = ("starting" if not self.failures else
                 "reconnecting" if self.opened else "no_source")
        return Health(state, self.reason, self._stats.retries, next_retry_at)

    def check(self, max_attempts: int | None) -> None:
        """Raise once ``max_attempts`` failures in a row are reached."""
        if max_attempts is not None and self.failures >= max_attempts:
            from ..errors import SourceError

            raise SourceError(f"camera {self._name}: gave up after {self.failures} failures "
                              f"in a row (last: {self.reason})")


class Backoff:
    """Capped exponential backoff with jitter, sleeping interruptibly on a stop event."""

    def __init__(self, config: ReconnectConfig, stop: threading.Event) -> None:
        self._config = config
        self._stop = stop
        self.attempts = 0
        self.next_at: float | None = None  # Unix time of the attempt being waited for

    def reset(self) -> None:
        self.attempts = 0

    def next_delay(self) -> float:
        c = self._config
        base = min(c.max_s, c.initial_s * (2 ** self.attempts))
        return float(base * (1.0 + random.uniform(0.0, 0.2)))

    def wait(self) -> bool:
        """Called after a failure: sleep the next delay and return ``True`` to try again, or
        ``False`` if stopped meanwhile or ``max_attempts`` failures in a row were reached."""
        limit = self._config.max_attempts
        if limit is not None and self.attempts + 1 >= limit:
            return False
        delay = self.next_delay()
        self.attempts += 1
        self.next_at = time.time() + delay
        try:
            return not self._stop.wait(delay)
        finally:
            self.next_at = None


class RateLimiter:
    """Pace or cap a stream at ``fps``.

    ``pace()`` sleeps until the next frame is due (file sources replayed in real time);
    ``admit(ts)`` says whether a frame captured at ``ts`` fits under the cap (live sources
    drop the rest).
    """

    def __init__(self, fps: float | None, stop: threading.Event | None = None) -> None:
        self.interval = 1.0 / fps if fps else 0.0
        self._next = 0.0
        self._stop = stop

    def pace(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if not self._next:  # the first frame goes now, the next one interval later
            self._next = now + self.interval
            return
        if self._next > now:
            if self._stop is not None:
                self._stop.wait(self._next - now)
            else:
                time.sleep(self._next - now)
            now = time.monotonic()
        self._next = max(self._next + self.interval, now - self.interval)

    def admit(self, ts: float) -> bool:
        if not self.interval:
            return True
        if ts + 1e-4 < self._next:
            return False
        self._next = max(self._next, ts) + self.interval
        return True
