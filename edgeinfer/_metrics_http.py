"""A Prometheus ``/metrics`` endpoint of our own: one registry served by a ``wsgiref`` server in
one thread, which ``stop()`` shuts down and whose port it closes. The daemon's endpoint
(``control.metrics``) and the fleet collector's (``fleet.metrics``) both serve through it; each
builds its own registry (not prometheus_client's global one: no process/GC collectors and
nothing another library registered). prometheus_client is the ``metrics`` extra.
"""

from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .errors import ConfigError

__all__ = ["MetricsEndpoint", "prometheus_client"]

logger = logging.getLogger("edgeinfer.control.metrics")


def prometheus_client() -> Any:
    """The prometheus_client module.

    Raises:
        ConfigError: it is not installed (the message names the extra).
    """
    try:
        import prometheus_client as module
    except ImportError as exc:
        raise ConfigError("metrics: needs prometheus_client; install it with "
                          "pip install 'edgeinfer[metrics]'") from exc
    return module


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("metrics: " + format, *args)


class MetricsEndpoint:
    """Serves ``registry`` on ``http://host:port/metrics`` (IPv4 or IPv6) until `stop`."""

    def __init__(self, registry: Any, host: str, port: int, *, name: str = "metrics") -> None:
        self.registry = registry
        self.host, self.config_port, self.name = host, port, name
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port (useful with port 0 in tests)."""
        return self._server.server_address[1] if self._server is not None else self.config_port

    @property
    def url(self) -> str:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        """Bind and serve.

        Raises:
            ConfigError: prometheus_client is missing, or the address cannot be bound.
        """
        app = prometheus_client().make_wsgi_app(self.registry)
        host, port = self.host, self.config_port

        class Server(_Server):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        try:
            self._server = make_server(host, port, app, server_class=Server,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(f"metrics: cannot serve on {host}:{port}: {exc}") from exc
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"edgeinfer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the port; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
