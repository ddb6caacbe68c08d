"""Connection limits of the web server: how many connections, from whom, and for how long.

A connection past ``http.max_connections_per_client`` from one address is reset at once (its
descriptor is released in the same loop turn). At ``http.max_connections`` in total the oldest
connection that is waiting for a request (an idle keep-alive one, or one still sending its
headers) is closed to make room, of an address holding several if there is one; when every
connection is busy with a request the new one is reset. A connection that has not sent a
complete request head within ``http.header_timeout_s`` (slowloris, or just idle) is closed.
Each of these is counted (`ConnectionGuard.stats`).

Request heads are bounded by bytes, as the parser holds them (a few copies of every byte): one
head to ``http.max_header_bytes`` (431, closed), the half-sent heads of one address together to
``http.max_header_bytes_per_client`` (its oldest half-sent head closed, 431) and of all
connections to ``http.max_header_bytes_total`` (the oldest half-sent head closed, 503), so a
thousand connections that each send a megabyte of headers and never finish cost the process
at most the total, and a new request still finds room. The bytes are counted before the parser
sees them: it never holds more of a head than the limit.

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
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

if TYPE_CHECKING:
    from ..config.http import HttpConfig

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
        max_head: ``http.max_header_bytes``.
        max_head_per_client: ``http.max_header_bytes_per_client``.
        max_head_total: ``http.max_header_bytes_total``.
    """

    def __init__(self, max_total: int, max_per_client: int, header_timeout: float,
                 max_head: int = 32 << 10, max_head_per_client: int = 1 << 20,
                 max_head_total: int = 4 << 20) -> None:
        self.max_total, self.max_per_client = max_total, max_per_client
        self.header_timeout = header_timeout
        # One head never passes its address's share, nor that the total (a smaller outer
        # limit wins; stats() shows the values in force).
        self.max_head_total = max_head_total
        self.max_head_per_client = min(max_head_per_client, max_head_total)
        self.max_head = min(max_head, self.max_head_per_client)
        self.log = QuietLog()
        self._open: OrderedDict[GuardedHandler, None] = OrderedDict()  # oldest first
        self._waiting: OrderedDict[GuardedHandler, None] = OrderedDict()  # no request running
        self._per_client: dict[str, int] = {}
        # Connections holding part of a request head, oldest head first: in all, and by address.
        self._heads: OrderedDict[GuardedHandler, None] = OrderedDict()
        self._client_heads: dict[str, OrderedDict[GuardedHandler, None]] = {}
        self._client_head_bytes: dict[str, int] = {}
        self.head_bytes = 0
        self.head_bytes_peak = 0
        self.counts = {"accepted": 0, "refused_per_client": 0, "refused_total": 0,
                       "evicted_idle": 0, "header_timeouts": 0, "heads_too_large": 0,
                       "heads_closed_per_client": 0, "heads_closed_total": 0}

    @classmethod
    def from_config(cls, config: HttpConfig, max_total: int) -> ConnectionGuard:
        """The guard of the ``http:`` section ``config``, at most ``max_total`` connections."""
        return cls(max_total, config.max_connections_per_client, config.header_timeout_s,
                   config.max_header_bytes, config.max_header_bytes_per_client,
                   config.max_header_bytes_total)

    def stats(self) -> dict[str, Any]:
        """Open connections, the limits, bytes of half-sent request heads held (now and at
        most), and what was refused or closed, by cause."""
        return {"open": len(self._open), "max": self.max_total,
                "max_per_client": self.max_per_client, "head_bytes": self.head_bytes,
                "head_bytes_peak": self.head_bytes_peak, "max_header_bytes": self.max_head,
                "max_header_bytes_per_client": self.max_head_per_client,
                "max_header_bytes_total": self.max_head_total, **self.counts,
                "server_errors_logged_at_debug": self.log.errors}

    def take_head(self, handler: GuardedHandler, size: int) -> bool:
        """Count ``size`` more bytes of ``handler``'s request head, closing the oldest other
        half-sent heads of its address, then of any, to make room; ``False``: its own head
        would pass ``max_head`` (the caller refuses it)."""
        if handler.head_bytes + size > self.max_head:
            self.counts["heads_too_large"] += 1
            return False
        client = handler.client
        mine = self._client_heads.get(client)
        while self._client_head_bytes.get(client, 0) + size > self.max_head_per_client:
            other = next((h for h in mine or () if h is not handler), None)
            if other is None:  # cannot happen while max_head <= max_head_per_client
                self.counts["heads_too_large"] += 1
                return False
            self.counts["heads_closed_per_client"] += 1
            other.refuse(431, "the request heads from your address are too large together")
        while self.head_bytes + size > self.max_head_total:
            other = next((h for h in self._heads if h is not handler), None)
            if other is None:
                self.counts["heads_too_large"] += 1
                return False
            self.counts["heads_closed_total"] += 1
            other.refuse(503, "the server is holding too many unfinished request heads")
        if handler.head_bytes == 0:
            self._heads[handler] = None
            self._client_heads.setdefault(client, OrderedDict())[handler] = None
        handler.head_bytes += size
        self._client_head_bytes[client] = self._client_head_bytes.get(client, 0) + size
        self.head_bytes += size
        self.head_bytes_peak = max(self.head_bytes_peak, self.head_bytes)
        return True

    def head_done(self, handler: GuardedHandler) -> None:
        """``handler``'s request head is complete, or its connection gone: its bytes are
        no longer held as a head."""
        size = handler.head_bytes
        if size == 0:
            return
        handler.head_bytes = 0
        client = handler.client
        self.head_bytes -= size
        self._heads.pop(handler, None)
        left = self._client_head_bytes.get(client, size) - size
        mine = self._client_heads.get(client)
        if mine is not None:
            mine.pop(handler, None)
        if left > 0:
            self._client_head_bytes[client] = left
        else:
            self._client_head_bytes.pop(client, None)
            self._client_heads.pop(client, None)

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
            # The oldest waiting connection of an address that holds several, else the oldest:
            # a flood from a few hundred addresses makes room with its own connections, not
            # with a client's one connection whose request is not read yet (CI: a legitimate
            # request reset under 1,100 idle connections).
            per = self._per_client
            victim = next((h for h in self._waiting if per.get(h.client, 0) > 1),
                          next(iter(self._waiting)))
            self.counts["evicted_idle"] += 1
            victim.drop()
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
        self.head_done(handler)
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
    header timer runs. Bytes that arrive while the parser reads a request head (not a body,
    not a WebSocket) are counted against the guard's head limits before it sees them.
    """

    def __init__(self, guard: ConnectionGuard, manager: web.Server, **kwargs: Any) -> None:
        line = min(8190, guard.max_head)  # aiohttp's own caps on one line, within the head's
        kwargs.setdefault("max_line_size", line)
        kwargs.setdefault("max_field_size", line)
        super().__init__(manager, logger=guard.log, **kwargs)  # type: ignore[arg-type]
        self.guard = guard
        self.client = "?"
        self.admitted = False
        self.running = 0
        self.head_bytes = 0
        self._refused = False
        self._body: Any = None  # the payload of the last request parsed (a StreamReader)
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

    def data_received(self, data: bytes) -> None:
        while data and not self._refused and self._reading_head():
            room = self.guard.max_head - self.head_bytes
            part, data = (data[:room], data[room:]) if len(data) > room else (data, b"")
            if not part:
                self.guard.counts["heads_too_large"] += 1
            if not part or not self.guard.take_head(self, len(part)):
                self.refuse(431, f"the request head is larger than http.max_header_bytes "
                                 f"({self.guard.max_head} bytes)")
                return
            # aiohttp appends what the parser completes to its queue of requests, which its
            # own task reads later: the newest entry is the request this part completed.
            before = self._request_count
            super().data_received(part)
            if self._request_count != before:
                self.guard.head_done(self)
                self._body = self._messages[-1][1] if self._messages else None
        if data and not self._refused:
            super().data_received(data)  # a body, or a WebSocket's frames

    def _reading_head(self) -> bool:
        """Whether the parser is between requests or inside a request head."""
        # ``_upgraded`` is aiohttp 3.10's name; 3.9 calls it ``_upgrade``
        upgraded = getattr(self, "_upgraded", None)
        if upgraded is None:
            upgraded = getattr(self, "_upgrade", False)
        if upgraded or self._payload_parser is not None or self._force_close:
            return False
        return self._body is None or bool(self._body.is_eof())

    def refuse(self, status: int, why: str) -> None:
        """Answer ``status`` (431 or 503) with ``why`` and close, dropping what was sent."""
        if self._refused:
            return
        self._refused = True
        reason = {431: "Request Header Fields Too Large"}.get(status, "Service Unavailable")
        body = (why + "\n").encode()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: "
                f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        self._disarm()
        self.guard.gone(self)
        if self._transport is not None:
            self._transport.close()  # after the answer; nothing more is read

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
