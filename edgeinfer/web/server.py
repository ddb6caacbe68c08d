"""`WebServer`: the aiohttp application on a thread of its own with its own event loop.

``start()`` returns once the socket is listening, or raises `ConfigError` when it cannot be
(the port in use, an address not on this machine, a certificate that does not load).
``stop()`` closes live views, waits for requests in flight (up to its timeout) and ends the
thread.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import ssl
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import ConfigError, StateError
from ..host import Host
from .app import WebApp
from .guard import ConnectionGuard, GuardedHandler, default_max_connections

if TYPE_CHECKING:
    from ..config.http import HttpConfig

__all__ = ["WebServer"]

logger = logging.getLogger(__name__)

_WORKERS = 3  # encoding, decoding and model runs; a Pi has 4 cores and the pipelines come first


class WebServer:
    """The daemon's local web view and REST API.

    Args:
        config: The ``http:`` section.
        host: The daemon (`Host`).
    """

    def __init__(self, config: HttpConfig, host: Host) -> None:
        self.config = config
        self.host = host
        self._pool = ThreadPoolExecutor(_WORKERS, thread_name_prefix="edgeinfer-web")
        self.guard = ConnectionGuard.from_config(
            config, config.max_connections or default_max_connections())
        self._app = WebApp(config, host, self._pool, self.guard)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._port = config.port
        self._state = "new"

    @property
    def url(self) -> str:
        """The server's base URL, e.g. ``http://127.0.0.1:8080/``."""
        scheme = "https" if self.config.tls is not None else "http"
        host = self.config.bind
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self._port}/"

    def stats(self) -> dict[str, Any]:
        """Requests, answers by status class, live viewers and frames encoded, infer calls."""
        return self._app.stats()

    def start(self) -> None:
        """Bind and serve; returns once listening.

        Raises:
            ConfigError: the address or port cannot be bound, or the certificate not loaded.
            StateError: started twice.
        """
        if self._state != "new":
            raise StateError(f"web server already {self._state}")
        self._state = "starting"
        context = _tls_context(self.config)
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(context, ready, failure),
                                        name="edgeinfer-web", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._state = "failed"
            self._thread.join(5)
            self._pool.shutdown(wait=False)
            raise _bind_error(self.config, failure[0]) from failure[0]
        self._state = "running"
        logger.info("web view at %s", self.url)

    def stop(self, timeout: float = 5.0) -> None:
        """Close live views and the listening socket, wait for requests in flight (up to
        ``timeout``), end the thread. Idempotent."""
        if self._state != "running" or self._loop is None:
            self._state = "stopped"
            return
        self._state = "stopping"
        loop = self._loop
        future = asyncio.run_coroutine_threadsafe(self._shutdown(timeout), loop)
        try:
            future.result(timeout + 2)
        except Exception as exc:  # a stuck handler must not keep the daemon from stopping
            logger.warning("web server: stopping: %s", exc)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._state = "stopped"

    # -- the loop thread ------------------------------------------------------------------------
    def _run(self, context: ssl.SSLContext | None, ready: threading.Event,
             failure: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._listen(context))
        except BaseException as exc:  # reported to start() in the caller's thread
            failure.append(exc)
            ready.set()
            loop.run_until_complete(self._cleanup())
            loop.close()
            return
        self._loop = loop
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _listen(self, context: ssl.SSLContext | None) -> None:
        self._runner = web.AppRunner(self._app.build(), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        manager = self._runner.server
        assert manager is not None
        guard, loop = self.guard, asyncio.get_running_loop()
        # aiohttp's keep-alive timer stays as a backstop behind the guard's header timer.
        options: dict[str, Any] = {
            "loop": loop, "access_log": None, "lingering_time": 0.5,
            "keepalive_timeout": 2 * self.config.header_timeout_s}
        self._listener = await loop.create_server(
            lambda: GuardedHandler(guard, manager, **options), self.config.bind,
            self.config.port, ssl=context, reuse_address=True, backlog=_BACKLOG,
            ssl_handshake_timeout=self.config.header_timeout_s if context else None)

    async def _shutdown(self, timeout: float) -> None:
        await self._app.feeds.close()
        await asyncio.wait_for(self._cleanup(), timeout)

    async def _cleanup(self) -> None:
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()


# Connections the kernel queues before they are accepted. asyncio's 100 overflowed under a LAN
# flood on a busy box (a legitimate client's SYN dropped: answered after its 1 s retransmit);
# far more lets a flood hold too many descriptors at once before the guard closes them.
_BACKLOG = 256


def _tls_context(config: HttpConfig) -> ssl.SSLContext | None:
    if config.tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(config.tls.cert_file), str(config.tls.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"http.tls: cannot load {config.tls.cert_file} with key "
                          f"{config.tls.key_file}: {exc}") from exc
    return context


def _bind_error(config: HttpConfig, exc: BaseException) -> ConfigError:
    where = f"{config.bind}:{config.port}"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return ConfigError(f"http: port {config.port} on {config.bind} is in use (another "
                           "program, or another edgeinfer); choose another http.port")
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES):
        return ConfigError(f"http: cannot listen on {where}: {exc.strerror} (http.bind must "
                           "be an address of this machine; ports below 1024 need privileges)")
    if isinstance(exc, OSError):
        return ConfigError(f"http: cannot listen on {where}: {exc}")
    return ConfigError(f"http: the web server did not start on {where}: {exc}")
