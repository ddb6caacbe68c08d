"""Connection limits of the web server: how many connections, from whom, and for how long.

A connection past ``http.max_connections_per_client`` from one address is reset at once (its
descriptor is released in the same loop turn). At ``http.max_connections`` in total the oldest
connection that is waiting for a request (an idle keep-alive one, or one still sending its
headers) is closed to make room; when every connection is busy with a request the new one is
reset. A connection that has not sent a complete request head within ``http.header_timeout_s``
(slowloris, or just idle) is closed. Each of these is counted (`ConnectionGuard.stats`).

aiohttp's own complaints about malformed requests and dropped connections (an ERROR with a
traceback each) go to `QuietLog`: counted, and logged at debug at most once a second.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

__all__ = ["BodyTimeout", "ConnectionGuard", "GuardedHandler", "QuietLog",
           "default_max_connections", "within"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_LOG_EVERY_S = 1.0


def default_max_connections() -> int:
    """A quarter of this process's descriptor limit (soft ``RLIMIT_NOFILE``), 16 to 1024: the
    rest stays for the pipelines, the outbox, the recorder and the models."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(16, min(1024, soft // 4))


class QuietLog:
    """Stands in for aiohttp's server logger: every error it reports (a malformed request, a
    client that went away) is counted and logged at debug, one line, at most once a second."""

    def __init__(self) -> None:
        self.errors = 0
        self._last = 0.0

    def _note(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.errors += 1
        now = time.monotonic()
        if now - self._last < _LOG_EVERY_S or not logger.isEnabledFor(logging.DEBUG):
            return
        self._last = now
        exc = kwargs.get("exc_info")
        why = (f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
               if isinstance(exc, BaseException) else "")
        logger.debug("web: " + msg + " %s (%d so far)", *args, why, self.errors)

    exception = error = warning = _note

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("web: " + msg, *args)

    info = debug


class ConnectionGuard:
    """The open connections of one server and the limits on them (all on its event loop).

    Args:
        max_total: ``http.max_connections``.
        max_per_client: ``http.max_connections_per_client``.
        header_timeout: ``http.header_timeout_s``.
    """

    def __init__(self, max_total: int, max_per_client: int, header_timeout: float) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.header_timeout = header_timeout
        self.log = QuietLog()
        self._open: OrderedDict[GuardedHandler, None] = OrderedDict()  # oldest first
        self._waiting: OrderedDict[GuardedHandler, None] = OrderedDict()  # no request running
        self._per_client: dict[str, int] = {}
        self.counts = {"accepted": 0, "refused_per_client": 0, "refused_total": 0,
                       "evicted_idle": 0, "header_timeouts": 0}

    def stats(self) -> dict[str, Any]:
        """Open connections, the limits, and what was refused or closed, by cause."""
        return {"open": len(self._open), "max": self.max_total,
                "max_per_client": self.max_per_client, **self.counts,
                "server_errors_logged_at_debug": self.log.errors}

    def admit(self, handler: GuardedHandler) -> bool:
        """Whether a new connection may stay (``False``: the caller resets it)."""
        client = handler.client
        if self._per_client.get(client, 0) >= self.max_per_client:
            self.counts["refused_per_client"] += 1
            return False
        if len(self._open) >= self.max_total:
            if not self._waiting:
                self.counts["refused_total"] += 1
                return False
            oldest = next(iter(self._waiting))
            self.counts["evicted_idle"] += 1
            oldest.drop()
        self.counts["accepted"] += 1
        self._open[handler] = None
        self._waiting[handler] = None
        self._per_client[client] = self._per_client.get(client, 0) + 1
        return True

    def busy(self, handler: GuardedHandler) -> None:
        self._waiting.pop(handler, None)

    def idle(self, handler: GuardedHandler) -> None:
        if handler in self._open:
            self._waiting[handler] = None

    def timed_out(self) -> None:
        self.counts["header_timeouts"] += 1

    def gone(self, handler: GuardedHandler) -> None:
        if handler not in self._open:
            return  # never admitted, or already counted out
        del self._open[handler]
        self._waiting.pop(handler, None)
        left = self._per_client.get(handler.client, 1) - 1
        if left > 0:
            self._per_client[handler.client] = left
        else:
            self._per_client.pop(handler.client, None)


class GuardedHandler(web.RequestHandler):
    """aiohttp's connection handler under a `ConnectionGuard`.

    The app's middleware calls `request_started` and `request_done`; between requests the
    header timer runs.
    """

    def __init__(self, guard: ConnectionGuard, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, logger=guard.log, **kwargs)  # type: ignore[arg-type]
        self.guard = guard
        self.client = "?"
        self.admitted = False
        self.running = 0
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self._transport = transport
        if not self.guard.admit(self):
            transport.abort()
            return
        self.admitted = True
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        if not self.admitted:
            return
        self.admitted = False
        self.guard.gone(self)
        super().connection_lost(exc)

    def request_started(self) -> None:
        self.running += 1
        self._disarm()
        self.guard.busy(self)

    def request_done(self) -> None:
        self.running -= 1
        if self.running == 0 and self.admitted:
            self.guard.idle(self)
            self._arm()

    def drop(self) -> None:
        """Close now, without waiting for anything (counted out of the guard at once)."""
        self._disarm()
        self.guard.gone(self)
        if self._transport is not None:
            self._transport.abort()

    def _arm(self) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(self.guard.header_timeout,
                                                            self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.running == 0 and self.admitted:
            self.guard.timed_out()
            self.drop()


class BodyTimeout(Exception):
    """A request body that did not arrive within ``http.body_timeout_s`` (answered 408)."""


async def within(seconds: float, awaitable: Awaitable[T]) -> T:
    """``await awaitable`` (a body read), for at most ``seconds``.

    Raises:
        BodyTimeout: it took longer.
    """
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within http.body_timeout_s "
                          f"({seconds:g} s)") from None
