"""Parts of `MqttClient` kept apart: the TLS context a `TlsConfig` asks for, why a connection
failed in words, when to say it again, which publish a PUBACK belongs to, a publish's MQTT 5
properties and the guard around user callbacks. Reasons read::

    certificate verify failed: self-signed certificate in certificate chain
    certificate verify failed: Hostname mismatch, certificate is not valid for 'localhost'.
    tlsv13 alert certificate required
    connection refused
"""

from __future__ import annotations

import logging
import os
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..config.mqtt import TlsConfig
from ..errors import ConfigError

__all__ = ["AckBook", "ConnackDeadline", "FailureLog", "PahoErrors", "ProtocolChoice",
           "call_safely", "os_reason", "publish_properties", "ssl_context", "tls_reason"]

logger = logging.getLogger("edgeinfer.mqtt.client")

# "[SSL: CERTIFICATE_VERIFY_FAILED] ... (_ssl.c:1006)": the words between are the reason.
_SSL_NOISE = re.compile(r"^\[[A-Z]+: [A-Z0-9_]+\] | \(_ssl\.c:\d+\)$")
PROPERTIES = {"response_topic": "ResponseTopic", "correlation_data": "CorrelationData",
              "content_type": "ContentType", "message_expiry": "MessageExpiryInterval"}


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """The client's TLS context: CA (or the system's), client certificate, minimum version and
    hostname check as configured.

    Raises:
        ConfigError: a file is missing or not a CA, certificate or key.
    """
    for name in ("ca_file", "cert_file", "key_file"):
        # ssl names no file in its FileNotFoundError (the CA's): say which key and which file
        value = getattr(tls, name)
        if value is not None and not os.path.isfile(value):
            raise ConfigError(f"mqtt.tls.{name}: no such file: {value}")
    try:
        ctx = ssl.create_default_context(cafile=tls.ca_file)
        ctx.minimum_version = (ssl.TLSVersion.TLSv1_3 if tls.min_version == "1.3"
                               else ssl.TLSVersion.TLSv1_2)
        ctx.check_hostname = tls.verify_hostname
        if tls.cert_file is not None:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
    except FileNotFoundError as exc:
        raise ConfigError(f"mqtt.tls: no such file {exc.filename or ''}".rstrip()) from exc
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"mqtt.tls: cannot load the CA, certificate or key: {exc}") from exc
    return ctx


def tls_reason(exc: ssl.SSLError) -> str:
    """``certificate verify failed: <what>`` or OpenSSL's reason, without codes and file lines."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message or exc.reason}"
    text = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], str) else str(exc)
    return _SSL_NOISE.sub("", text) or type(exc).__name__


def os_reason(exc: BaseException | None, host: str) -> str:
    """Why connecting to (or talking with) ``host`` failed, from the exception paho caught."""
    if exc is None:
        return "connection failed"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ssl.SSLError):
        return tls_reason(exc)
    if isinstance(exc, OSError) and exc.strerror:
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve {host!r}: {exc.strerror}"
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


class FailureLog:
    """Logs a failing state once, then at most every ``every_s`` while the same one persists.

    Args:
        where: The broker's ``host:port``, for the messages.
        every_s: How often a persisting condition is logged again.
    """

    _WHAT = {"auth_failed": "credentials refused: ", "tls_error": "TLS failed: "}

    def __init__(self, where: str, every_s: float = 300.0) -> None:
        self._where = where
        self._every_s = every_s
        self._last: tuple[str, str] | None = None
        self._at = 0.0

    def report(self, state: str, error: str) -> None:
        """Log ``error`` for ``state`` unless it was logged less than ``every_s`` ago."""
        now = time.monotonic()
        again = self._last == (state, error)
        if again and now - self._at < self._every_s:
            return
        self._last, self._at = (state, error), now
        level = logging.WARNING if state in ("connecting", "disconnected") else logging.ERROR
        logger.log(level, "MQTT broker %s: %s%s; %sretrying with backoff", self._where,
                   self._WHAT.get(state, ""), error, "still " if again else "")

    def reset(self) -> None:
        """Connected: the next failure is news again."""
        self._last = None


class AckBook:
    """Which callback a PUBACK (or a QoS 0 write) belongs to, by message id.

    paho's network thread may see the acknowledgement before ``publish()`` has returned the mid
    to its caller; such an early one is kept until the publisher claims its mid.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[int, Callable[[], None]] = {}
        self._early: dict[int, bool] = {}

    def claim(self, mid: int, on_ack: Callable[[], None]) -> bool | None:
        """Register ``on_ack`` for ``mid``; if its acknowledgement came first, return whether it
        was a success (the caller then calls ``on_ack`` itself) instead."""
        with self._lock:
            early = self._early.pop(mid, None)
            if early is None:
                self._waiting[mid] = on_ack
            return early

    def settle(self, mid: int, ok: bool) -> Callable[[], None] | None:
        """The callback waiting for ``mid``, or None if none is registered yet (kept as early)."""
        with self._lock:
            on_ack = self._waiting.pop(mid, None)
            if on_ack is None:
                self._early[mid] = ok
            return on_ack

    def clear(self) -> None:
        with self._lock:
            self._waiting.clear()
            self._early.clear()


class PahoErrors:
    """Stands in for paho's logger: hands on its errors (why a socket failed) and drops the
    rest without formatting, so the per-packet path pays one call."""

    __slots__ = ("_sink",)

    def __init__(self, sink: Callable[[str, tuple[Any, ...]], None]) -> None:
        self._sink = sink

    def log(self, level: int, msg: str, *args: Any) -> None:
        if level >= logging.ERROR:
            self._sink(msg, args)


class ProtocolChoice:
    """Which MQTT version the next CONNECT uses, for ``mqtt.protocol`` ``auto``, ``v5`` or
    ``v3.1.1``.

    ``auto`` starts with MQTT 5 and falls back to 3.1.1 when the broker refuses it (CONNACK
    "Unsupported protocol version": NATS, amqtt) or gives no CONNACK at all (closes the
    connection: RabbitMQ 3.10; or stays silent: amqtt misreads an MQTT 5 CONNECT with a will).
    Before a first success any such failure switches; after one, only an explicit refusal
    does (a silence then is an outage, not a verdict on the version). A 3.1.1 attempt that gets
    no CONNACK before any success tries MQTT 5 again, unless the broker refused MQTT 5.
    """

    __slots__ = ("mode", "v5", "_settled", "_v5_refused")

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.v5 = mode != "v3.1.1"
        self._settled = False
        self._v5_refused = False

    @property
    def name(self) -> str:
        """``v5`` or ``v3.1.1``: the version in use (or being tried)."""
        return "v5" if self.v5 else "v3.1.1"

    def connected(self) -> None:
        """A CONNACK accepted the current version."""
        self._settled = True

    def failed(self, *, refused: bool) -> bool:
        """The broker refused the version (``refused``) or gave no CONNACK; returns whether
        the next attempt uses the other version (``auto`` only)."""
        if self.mode != "auto":
            return False
        if self.v5 and (refused or not self._settled):
            self._v5_refused = self._v5_refused or refused
            self.v5 = False
            return True
        if not self.v5 and not refused and not self._settled and not self._v5_refused:
            self.v5 = True
            return True
        return False

    def apply(self, client: paho.Client) -> None:
        """Make ``client``'s next CONNECT use the chosen version (network thread, between
        attempts)."""
        # paho fixes the version in its constructor and has no setter; it rewrites _protocol
        # itself when it falls back from 3.1.1 to 3.1 (Client._handle_connack), as done here.
        client._protocol = paho.MQTTv5 if self.v5 else paho.MQTTv311
        client._clean_session = True  # read under 3.1.1 only; a v5 client never set it


class ConnackDeadline:
    """Gives up a CONNECT left unanswered for ``seconds``: shuts the socket down, so that paho's
    network thread reads EOF, calls ``on_disconnect`` and makes its next attempt.

    paho itself waits a whole keepalive for a CONNACK; a broker that misreads the CONNECT
    (amqtt given MQTT 5 with a will) would hold every attempt that long.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._overdue = False

    def arm(self, client: paho.Client, sock: Any) -> None:
        """A socket to the broker opened (paho's ``on_socket_open``): start counting."""
        timer = threading.Timer(self.seconds, self._late, (client, sock))
        timer.daemon = True
        with self._lock:
            old, self._timer = self._timer, timer
        if old is not None:
            old.cancel()
        timer.start()

    def disarm(self) -> None:
        """A CONNACK came, the attempt ended otherwise, or the client stops."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def take_overdue(self) -> bool:
        """Whether the attempt that just ended was given up here (and forget it)."""
        with self._lock:
            overdue, self._overdue = self._overdue, False
        return overdue

    def _late(self, client: paho.Client, sock: Any) -> None:
        with self._lock:
            if self._timer is None:
                return
            self._timer = None
            if client.socket() is not sock or not isinstance(sock, socket.socket):
                return
            self._overdue = True
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed meanwhile
            pass


def publish_properties(given: Mapping[str, Any]) -> Properties:
    """The MQTT 5 properties of a publish from their names in `MqttClient.publish`.

    Raises:
        ValueError: a name not in ``PROPERTIES``.
    """
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    for key, value in given.items():
        name = PROPERTIES.get(key)
        if name is None:
            raise ValueError(f"unknown MQTT property {key!r}; valid: {', '.join(PROPERTIES)}")
        if value is not None:
            setattr(props, name, value)
    return props


def call_safely(fn: Callable[..., None], what: str, *args: Any) -> None:
    """Call a user's callback in paho's network thread: an exception is logged, and must never
    end that thread."""
    try:
        fn(*args)
    except Exception:
        logger.exception("MQTT %s callback failed", what)
