"""A small MQTT broker inside the process (``mqtt: {embedded: true}``), for the demo and for a
device with no broker: amqtt in its own thread with its own asyncio loop.

    with EmbeddedBroker("127.0.0.1", 1883):
        client = MqttClient(config.mqtt, device_id)   # speaks MQTT 3.1.1 to it
        ...

amqtt (the ``broker`` extra) implements MQTT 3.1.1 only: an MQTT 5 CONNECT is answered
"unsupported protocol version" (one with a will is misread and never answered). `MqttClient`
therefore uses 3.1.1 whenever ``embedded`` is set.
QoS 0/1/2 and retained messages work; nothing is persisted (a restart forgets retained
messages). amqtt 0.12.1 sends a connecting client the retained messages matching *any* client's
subscriptions (``mosquitto_sub -t foo/bar`` got ``edgeinfer/<dev>/status``); the broker run here
sends a client only those matching its own (`_OwnRetainedBroker`). On loopback anonymous
clients are allowed; on any other address ``username`` and ``password`` are required and
checked.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import threading
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, Self

from ..config.mqtt import MqttConfig
from ..errors import ConfigError, StateError

__all__ = ["EmbeddedBroker", "PROTOCOL", "amqtt_missing"]

logger = logging.getLogger(__name__)

PROTOCOL = "v3.1.1"
"""The only MQTT version the embedded broker speaks."""

_INSTALL = "the embedded MQTT broker needs amqtt: pip install 'edgeinfer[broker]'"


def amqtt_missing() -> str | None:
    """The install hint when amqtt (the embedded broker) is not installed, else ``None``;
    found without importing the broker (``edgeinfer validate-config`` asks the same as the
    start)."""
    try:
        found = find_spec("amqtt.broker")  # imports the package amqtt only
    except ImportError:  # no package amqtt
        found = None
    return _INSTALL if found is None else None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class EmbeddedBroker:
    """An amqtt broker serving plain TCP on ``host``:``port``.

    Args:
        host: Address to listen on (loopback by default).
        port: TCP port.
        username, password: When given, clients must present them; required off loopback.
        max_connections: Clients served at once.

    Raises:
        ConfigError: not on loopback and no credentials.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 1883, *, username: str | None = None,
                 password: str | None = None, max_connections: int = 64) -> None:
        if (username is None or password is None) and not _is_loopback(host):
            raise ConfigError(f"mqtt: the embedded broker on {host} (not loopback) needs "
                              "`username` and `password`; anonymous clients are allowed on "
                              "loopback only")
        self.host, self.port = host, port
        self._credentials = (username, password) if username is not None else None
        self._max_connections = max_connections
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._broker: Any = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @classmethod
    def from_config(cls, config: MqttConfig) -> EmbeddedBroker:
        """The broker an ``mqtt:`` section with ``embedded: true`` asks for.

        Raises:
            ConfigError: ``tls`` is set (the embedded broker serves plain TCP), or a
                non-loopback host without credentials.
        """
        if config.tls is not None:
            raise ConfigError("mqtt: the embedded broker serves plain TCP; remove `tls` or "
                              "point `host` at a broker such as mosquitto")
        return cls(config.host, config.resolved_port(), username=config.username,
                   password=config.password)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._broker is not None

    def start(self, timeout_s: float = 10.0) -> None:
        """Listen; returns once clients can connect.

        Raises:
            ConfigError: amqtt is not installed, or the address cannot be listened on.
            StateError: already started.
        """
        if self._thread is not None:
            raise StateError(f"embedded MQTT broker on {self.address} already started")
        missing = amqtt_missing()
        if missing is not None:
            raise ConfigError(missing)
        # amqtt (and its state machine library) log every connection and state change at
        # INFO; keep them to warnings unless configured otherwise.
        for name in ("amqtt", "transitions"):
            noisy = logging.getLogger(name)
            if noisy.level == logging.NOTSET:
                noisy.setLevel(logging.WARNING)
        _check_bindable(self.host, self.port)
        self._ready.clear()
        self._error = None
        self._thread = threading.Thread(target=self._run, name="edgeinfer-mqtt-broker", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise ConfigError(f"embedded MQTT broker on {self.address} did not start within "
                              f"{timeout_s:g} s")
        if self._error is not None:
            self._thread.join(timeout_s)
            self._thread = None
            raise ConfigError(f"embedded MQTT broker cannot listen on {self.address}: "
                              f"{_reason(self._error)}") from self._error
        logger.info("embedded MQTT broker listening on %s (MQTT 3.1.1)", self.address)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Disconnect every client and stop listening. Idempotent."""
        thread, loop, broker = self._thread, self._loop, self._broker
        if thread is None or loop is None:
            return
        if broker is not None:
            try:
                asyncio.run_coroutine_threadsafe(broker.shutdown(), loop).result(timeout_s)
            except Exception as exc:  # a broker that fails to shut down is stopped anyway
                logger.warning("embedded MQTT broker shutdown: %s", _reason(exc))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        self._thread = self._loop = self._broker = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _config(self) -> dict[str, Any]:
        auth: dict[str, dict[str, Any]]
        if self._credentials is None:
            auth = {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}}
        else:
            user, password = self._credentials
            auth = {f"{__name__}.PasswordAuthPlugin": {"username": user, "password": password}}
        return {
            "listeners": {"default": {"type": "tcp", "bind": f"{self.host}:{self.port}",
                                      "max_connections": self._max_connections}},
            "plugins": auth,  # no $SYS topics, no packet logging
        }

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            broker = _OwnRetainedBroker(self._config(), loop=loop)
            loop.run_until_complete(broker.start())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._broker = broker
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()


def _check_bindable(host: str, port: int) -> None:
    # Said here in one line rather than by amqtt's logged traceback of the same failure.
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except OSError as exc:
        raise ConfigError(f"embedded MQTT broker cannot listen on {host}:{port}: "
                          f"{exc.strerror or exc}") from exc


def _reason(exc: BaseException) -> str:
    # amqtt wraps the OSError of a port in use in BrokerError("... can't be started: ...").
    cause = exc.__cause__ or exc
    return getattr(cause, "strerror", None) or str(cause) or type(cause).__name__


try:
    from amqtt.broker import Broker
    from amqtt.plugins.authentication import BaseAuthPlugin
except ImportError:  # the broker extra is not installed; start() says so
    pass
else:

    class _OwnRetainedBroker(Broker):  # type: ignore[misc]
        """amqtt's broker, sending a client only the retained messages of its own filters.

        At connect amqtt 0.12.1 calls ``_publish_retained_messages_for_subscription`` for every
        filter any client holds (meant: the connecting session's); at subscribe, for the new
        filter, after recording it. Both now go through only for a filter the client holds.
        """

        async def _publish_retained_messages_for_subscription(
                self, subscription: tuple[str, int], session: Any) -> None:
            holders = self._subscriptions.get(subscription[0], ())
            if any(s.client_id == session.client_id for s, _ in holders):
                await super()._publish_retained_messages_for_subscription(subscription, session)

    class PasswordAuthPlugin(BaseAuthPlugin):  # type: ignore[misc]
        """amqtt plugin: accept the one configured username and password."""

        @dataclass
        class Config:
            username: str
            password: str

        async def authenticate(self, *, session: Any) -> bool:
            config = self.context.config
            user_ok = hmac.compare_digest((session.username or "").encode(), config.username.encode())
            password_ok = hmac.compare_digest((session.password or "").encode(),
                                              config.password.encode())
            return user_ok and password_ok
