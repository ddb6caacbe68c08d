"""The ``Sink`` interface: where results go. A sink is a context manager; ``write`` is called
from the pipeline's emit thread, one result at a time, and must not block for long (the MQTT
sink hands results to its durable outbox).

A ``write`` that raises is counted and logged by ``failed`` (the first failure at once, then at
most once a minute with how many failed meanwhile), and the sink is *failing* until a write goes
through again: the daemon reports that pipeline as unhealthy and, if it lasts, restarts it like
a stuck one (see ``edgeinfer.daemon``).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import Any, Self

from ..frames import Result

logger = logging.getLogger(__name__)

LOG_EVERY_S = 60.0  # a sink that keeps failing is logged again at most this often


class Sink(ABC):
    def __init__(self, config: Any) -> None:
        self.config = config
        self.written = 0
        self.errors = 0
        self.last_error = ""
        self.failing_since = 0.0  # monotonic time of the first failure in a row, 0.0: working
        self._logged_at = 0.0
        self._logged_errors = 0

    def open(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Acquire the file, connection or stream."""

    @abstractmethod
    def write(self, result: Result) -> None:
        """Deliver one result."""

    def write_event(self, pipeline: str, event: dict[str, Any]) -> None:  # noqa: B027
        """Deliver one scene analytics event (a sink that publishes events on their own
        topic overrides this; the others see events in the results that carry them)."""

    def close(self) -> None:  # noqa: B027 (an optional hook, not abstract)
        """Flush and release; idempotent."""

    def failed(self, exc: BaseException, pipeline: str) -> None:
        """A ``write`` raised ``exc``: count it, log it (rate-limited), mark the sink failing."""
        now = time.monotonic()
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if not self.failing_since:
            self.failing_since = now
        if self._logged_errors and now - self._logged_at < LOG_EVERY_S:
            return
        again, since = self.errors - self._logged_errors, now - self._logged_at
        first = not self._logged_errors
        self._logged_at, self._logged_errors = now, self.errors
        if first:
            logger.error("pipeline %s: sink %s failed: %s; the results it should have written "
                         "are lost", pipeline, type(self).__name__, self.last_error)
        else:
            logger.error("pipeline %s: sink %s failed %d more times in %.0f s (%d in all), "
                         "last: %s", pipeline, type(self).__name__, again, since, self.errors,
                         self.last_error)

    def succeeded(self, pipeline: str) -> None:
        """A ``write`` went through after failures (the caller checks ``failing_since``)."""
        logger.warning("pipeline %s: sink %s works again after %d failures", pipeline,
                       type(self).__name__, self.errors)
        self.failing_since = 0.0

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
