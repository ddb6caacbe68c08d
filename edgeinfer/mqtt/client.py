"""The one MQTT connection of a device, on paho-mqtt 2.x (callback API version 2).

    client = MqttClient(config.mqtt, config.resolved_device_id(), birth=lambda: {...})
    client.start()                      # returns at once; connects (and reconnects) in the background
    client.publish(client.topics.result("faces"), payload, on_ack=outbox.acked)
    client.stop()                       # retained {"state": "stopped"}, then disconnect

It announces the device on ``<prefix>/<dev>/status`` (retained): ``online`` with the birth JSON
after every connect, ``offline`` as the last will, ``stopped`` on a clean stop. It never gives
up: a broker that is down, refuses the credentials or fails TLS is retried with capped
exponential backoff and jitter, the reason kept in `MqttClient.state` and ``last_error`` and
logged once (then at most every few minutes), never the password.

With ``protocol: auto`` (the default) it tries MQTT 5 and falls back to 3.1.1 when the broker
refuses MQTT 5 or sends no CONNACK within `connack_timeout_s` (see `ProtocolChoice`); the
version in use is `MqttClient.protocol`, logged at connect and announced in the birth.

Callbacks (``on_ack``, subscriptions, ``on_connect``) run in paho's network thread, some with
paho's locks held: they must be short (queue the work) and must not block on that thread.
Received messages reach their subscriptions through ``subscriptions.Subscriptions``.
"""

# Over 450 lines: one connection state machine; paho's callbacks share its lock, flags and backoff.

from __future__ import annotations

import json
import logging
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Self

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from ..config.mqtt import MqttConfig
from ..errors import StateError
from ..sources.base import Backoff
from ..version import __version__
from ._connection import (AckBook, ConnackDeadline, FailureLog, PahoErrors, ProtocolChoice,
                          call_safely, os_reason, publish_properties, ssl_context, tls_reason)
from .subscriptions import Message, Subscriptions
from .topics import Topics, check_filter

__all__ = ["Message", "MqttClient"]

logger = logging.getLogger(__name__)

_AUTH_REFUSED = (134, 135)  # Bad user name or password, Not authorized (3.1.1's 4 and 5 map here)
_UNSUPPORTED_PROTOCOL = (1, 132)
_REPORT_EVERY_S = 300.0  # a condition that persists is logged again at most this often
_CONNACK_MAX_S = 10.0  # a broker silent this long (at most keepalive_s) after CONNECT is retried
_MAX_INFLIGHT = 100  # QoS 1 messages awaiting PUBACK; more wait in paho's queue


def _noop() -> None:
    pass


class MqttClient:
    """A reconnecting MQTT client that announces the device and acknowledges publishes.

    Args:
        config: The ``mqtt:`` section. With ``embedded: true`` MQTT 3.1.1 is used whatever
            ``protocol`` says: the embedded broker (amqtt) speaks only 3.1.1. ``auto`` tries
            MQTT 5 first and falls back to 3.1.1 (see the module docstring).
        device_id: This device's topic level.
        birth: Extra fields for the ``online`` status (pipelines, models, providers), called on
            every connect.
        announce: Publish the status topic (birth, last will, ``stopped``); ``False`` for a
            client that only watches (``edgeinfer watch``).
        max_packet_bytes: Announced to an MQTT 5 broker as the CONNECT's Maximum Packet Size:
            the broker drops (for this client only) any larger message instead of sending it.
            ``None``: no limit announced. MQTT 3.1.1 has no such property: there the
            broker's own limit (mosquitto's ``max_packet_size``) is all there is.
        connack_timeout_s: How long a CONNECT may go unanswered before the attempt is given up
            (and, with ``auto``, the other version tried). Default ``keepalive_s``, at most 10.

    Attributes:
        topics: This device's topic names.
        state: ``connecting`` (never connected yet), ``connected``, ``disconnected`` (lost,
            retrying), ``auth_failed``, ``tls_error`` or ``stopped``.
        last_error: Why the last attempt failed or the connection was lost (``""`` connected).
        reconnects: Connections made after the first one.
        refused: Publishes the broker refused (an MQTT 5 PUBACK with a failure reason code, e.g.
            an ACL); their ``on_ack`` is never called.
        protocol: ``v5`` or ``v3.1.1``: the MQTT version connected with (or being tried).

    Raises:
        ConfigError: a TLS file cannot be read (the constructor checks them).
    """

    def __init__(self, config: MqttConfig, device_id: str, *,
                 birth: Callable[[], dict[str, Any]] | None = None, announce: bool = True,
                 max_packet_bytes: int | None = None,
                 connack_timeout_s: float | None = None) -> None:
        self.config = config
        self.max_packet_bytes = max_packet_bytes
        self.topics = Topics(config.prefix, device_id)
        self.state = "disconnected"
        self.last_error = ""
        self.reconnects = 0
        self.refused = 0
        self._birth = birth
        self._announce = announce
        self._choice = ProtocolChoice("v3.1.1" if config.embedded else config.protocol)
        self._connack = ConnackDeadline(connack_timeout_s
                                        or min(float(config.keepalive_s), _CONNACK_MAX_S))
        self._client_id = config.client_id or f"edgeinfer-{device_id}"
        self._where = f"{config.host}:{config.resolved_port()}"
        self._ssl = ssl_context(config.tls) if config.tls is not None else None
        self._paho: paho.Client | None = None
        self._lock = threading.Lock()
        self._connected = False
        self._connected_event = threading.Event()
        self._ever_connected = False
        self._stopping = False
        self._refused_connect = False
        self._socket_error: BaseException | None = None
        self._backoff = Backoff(config.reconnect, threading.Event())
        self._subs = Subscriptions(self._where)
        self._acks = AckBook()
        self._on_connect: list[Callable[[], None]] = []
        self._on_disconnect: list[Callable[[], None]] = []
        self._failures = FailureLog(self._where, _REPORT_EVERY_S)
        self._refused_reported_at = -_REPORT_EVERY_S

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start connecting in the background and return at once.

        Raises:
            StateError: already started, or stopped (make a new client).
        """
        with self._lock:
            if self._paho is not None or self.state == "stopped":
                raise StateError(f"MQTT client {self._client_id} already {self.state}; "
                                 "a client starts once")
            self.state = "connecting"
            self._paho = client = self._make_paho()
        c = self.config
        if self._v5:  # v5 or auto: what a switch to MQTT 5 sends too (3.1.1 ignores both)
            props = None
            if self.max_packet_bytes is not None:
                props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                props.MaximumPacketSize = self.max_packet_bytes
            client.connect_async(c.host, c.resolved_port(), c.keepalive_s, clean_start=True,
                                 properties=props)
        else:
            client.connect_async(c.host, c.resolved_port(), c.keepalive_s)
        client.loop_start()

    def _make_paho(self) -> paho.Client:
        c = self.config
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=self._client_id,
                             protocol=paho.MQTTv5 if self._v5 else paho.MQTTv311,
                             clean_session=None if self._v5 else True)
        client.suppress_exceptions = True  # an exception must never end the network thread
        client.enable_logger(PahoErrors(self._paho_error))  # type: ignore[arg-type]
        client.max_inflight_messages_set(_MAX_INFLIGHT)
        first = self._backoff.next_delay()
        client.reconnect_delay_set(first, first)  # type: ignore[arg-type]
        if c.username is not None:
            client.username_pw_set(c.username, c.password)
        if self._ssl is not None:
            client.tls_set_context(self._ssl)
        if self._announce:
            client.will_set(self.topics.status, self._status("offline"), qos=1, retain=True)
        client.on_connect = self._handle_connect
        client.on_connect_fail = self._handle_connect_fail
        client.on_socket_open = lambda c, _u, sock: self._connack.arm(c, sock)
        client.on_disconnect = self._handle_disconnect
        client.on_publish = self._handle_publish
        client.on_message = self._handle_message
        return client

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Publish the retained ``stopped`` status (waiting up to ``timeout_s`` for its PUBACK),
        disconnect cleanly (no last will) and end the network thread. Idempotent.

        Messages still waiting for a PUBACK are dropped without ``on_ack``.
        """
        with self._lock:
            if self.state == "stopped":
                return
            self._stopping = True
            client = self._paho
        if client is not None:
            if self._connected and self._announce:
                info = self._send_status(client, "stopped")
                try:
                    info.wait_for_publish(timeout_s)
                except (RuntimeError, ValueError):  # the connection went meanwhile
                    pass
            client.disconnect()
            client.loop_stop()
        with self._lock:
            self.state = "stopped"
            self._connected = False
            self._connected_event.clear()
        self._connack.disarm()
        self._acks.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def protocol(self) -> str:
        """``v5`` or ``v3.1.1``: the MQTT version connected with (or being tried)."""
        return self._choice.name

    @property
    def _v5(self) -> bool:
        return self._choice.v5

    @property
    def connected(self) -> bool:
        """Connected and announced (birth sent, subscriptions renewed)."""
        return self._connected

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a connection; ``True`` if connected."""
        return self._connected_event.wait(timeout_s)

    def on_connect(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (network thread) after every connect, birth and resubscriptions."""
        self._on_connect.append(fn)

    def on_disconnect(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (network thread) when an established connection is lost."""
        self._on_disconnect.append(fn)

    # -- publish and subscribe ----------------------------------------------------------------
    def publish(self, topic: str, payload: bytes | str, *, qos: int = 1, retain: bool = False,
                on_ack: Callable[[], None] | None = None,
                properties: Mapping[str, Any] | None = None) -> bool:
        """Hand a message to paho.

        Args:
            topic: Where to publish.
            payload: The bytes (a str is sent as UTF-8).
            qos: 0 or 1.
            retain: Ask the broker to keep it for later subscribers.
            on_ack: Called exactly once (network thread) when the broker acknowledged it: its
                PUBACK for QoS 1, when written for QoS 0. Not called for a message the broker
                refused (MQTT 5 failure reason code) nor for one still unacknowledged at `stop`.
                A message sent before a connection loss is resent by paho after reconnecting.
            properties: MQTT 5 ``response_topic``, ``correlation_data``, ``content_type``,
                ``message_expiry``; ignored under 3.1.1.

        Returns:
            ``False`` when not connected (nothing queued: the caller keeps the message), else
            ``True``.

        Raises:
            ValueError: an invalid topic, QoS or property name.
        """
        client = self._paho
        if not self._connected or client is None:
            return False
        props = publish_properties(properties) if properties and self._v5 else None
        info = client.publish(topic, payload, qos, retain, props)
        rc = info.rc
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS and not (rc == MQTTErrorCode.MQTT_ERR_NO_CONN and qos):
            return False  # QoS 0 while the connection just went, or paho's queue full
        early = self._acks.claim(info.mid, on_ack or _noop)
        if early is not None:  # acknowledged before claim() registered it
            if not early:
                self._refuse("refused")
            elif on_ack is not None:
                call_safely(on_ack, "on_ack")
        return True

    def subscribe(self, topic: str, qos: int, on_message: Callable[[Message], None]) -> Callable[[], None]:
        """Call ``on_message`` (network thread) for every message matching filter ``topic``.

        The subscription is renewed after every reconnect. Returns the function that ends it.

        Raises:
            ValueError: an invalid filter.
        """
        check_filter(topic)
        with self._lock:
            sub = self._subs.add(topic, qos, on_message)
            qos = self._subs.qos(topic)
            connected, client = self._connected, self._paho
        if connected and client is not None:
            client.subscribe(topic, qos)

        def unsubscribe() -> None:
            with self._lock:
                still = self._subs.remove(sub)
                connected, client = self._connected, self._paho
            if not still and connected and client is not None:
                client.unsubscribe(topic)

        return unsubscribe

    # -- paho callbacks (network thread) ------------------------------------------------------
    def _handle_connect(self, client: paho.Client, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        self._connack.disarm()
        if reason.is_failure:
            self._refused_connect = True
            if reason.value in _AUTH_REFUSED:
                user = f"user {self.config.username!r}" if self.config.username else "no username"
                self._report("auth_failed", f"{reason} ({user}); check mqtt.username/password")
            elif reason.value in _UNSUPPORTED_PROTOCOL and self._v5:
                if not self._switch_protocol(client, str(reason), refused=True):
                    self._report(self._down_state(), f"{reason}: the broker does not speak "
                                 "MQTT 5; set mqtt.protocol: v3.1.1 (or auto)")
            else:
                self._report(self._down_state(), f"refused: {reason}")
            return
        self._choice.connected()
        self._refused_connect = False
        self._socket_error = None
        if self._ever_connected:
            self.reconnects += 1
        self._ever_connected = True
        self._backoff.reset()
        with self._lock:
            self._connected = True
            self.state, self.last_error = "connected", ""
            subs = self._subs.filters()
        for topic, qos in subs.items():
            client.subscribe(topic, qos)
        if self._announce:  # after the subscriptions: "online" means commands are taken
            self._send_status(client, "online")
        self._failures.reset()
        logger.info("connected to MQTT broker %s as %s (MQTT %s%s)", self._where, self._client_id,
                    "5" if self._v5 else "3.1.1",
                    ", chosen by protocol: auto" if self._choice.mode == "auto" else "")
        if not self._v5 and self.max_packet_bytes is not None and self.reconnects == 0:
            # said when auto chose it; one who wrote v3.1.1 knows (docs/mqtt.md, message sizes)
            logger.log(logging.INFO if self._choice.mode == "auto" else logging.DEBUG,
                       "MQTT 3.1.1 cannot announce a Maximum Packet Size (%d bytes): larger "
                       "messages are limited only by the broker's own setting",
                       self.max_packet_bytes)
        self._connected_event.set()
        for fn in self._on_connect:
            call_safely(fn, "on_connect")

    def _handle_connect_fail(self, _client: paho.Client, _u: Any) -> None:
        exc = sys.exc_info()[1]  # paho calls this inside its `except OSError` block
        if isinstance(exc, ssl.SSLError):
            self._report("tls_error", tls_reason(exc))
        else:
            self._report(self._down_state(), os_reason(exc, self.config.host))
        self._next_retry()

    def _handle_disconnect(self, _client: paho.Client, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        self._connack.disarm()
        with self._lock:
            was, self._connected = self._connected, False
        self._connected_event.clear()
        if self._stopping:
            return
        error, self._socket_error = self._socket_error, None
        if was:
            self.state = "disconnected"
            if error is not None:
                self.last_error = os_reason(error, self.config.host)
            else:  # 128 "Unspecified error" is what paho says for a closed socket
                self.last_error = "connection lost" if reason.value == 128 else str(reason)
            logger.warning("lost MQTT broker %s (%s); reconnecting", self._where, self.last_error)
            for fn in self._on_disconnect:
                call_safely(fn, "on_disconnect")
        elif isinstance(error, ssl.SSLError):
            self._report("tls_error", tls_reason(error))
        elif not self._refused_connect:
            # Connected, then no CONNACK: silent, closed (RabbitMQ given MQTT 5) or reset.
            if self._connack.take_overdue():
                why = f"no CONNACK within {self._connack.seconds:g} s"
            elif error is not None:
                why = os_reason(error, self.config.host)
            else:
                why = f"no CONNACK from the broker ({reason})"
            if not self._switch_protocol(_client, why, refused=False):
                hint = ("; if it speaks only MQTT 3.1.1 set mqtt.protocol: v3.1.1 (or auto)"
                        if self._choice.mode == "v5" else "")
                self._report(self._down_state(), why + hint)
        self._refused_connect = False
        self._next_retry()

    def _switch_protocol(self, client: paho.Client, why: str, *, refused: bool) -> bool:
        was = self.protocol
        if not self._choice.failed(refused=refused):
            return False
        self._choice.apply(client)
        self._backoff.reset()  # the other version is tried at once, not after a backoff
        self.state, self.last_error = self._down_state(), f"MQTT {was}: {why}"
        logger.info("MQTT broker %s: %s with MQTT %s; trying MQTT %s (protocol: auto)",
                    self._where, why, was[1:], self.protocol[1:])
        return True

    def _handle_publish(self, _client: paho.Client, _u: Any, mid: int, reason: Any, _p: Any) -> None:
        ok = not reason.is_failure
        on_ack = self._acks.settle(mid, ok)
        if on_ack is None:
            return
        if ok:
            call_safely(on_ack, "on_ack")
        else:
            self._refuse(reason)

    def _refuse(self, reason: object) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_reported_at > _REPORT_EVERY_S:
            self._refused_reported_at = now
            logger.warning("MQTT broker %s refused a publish: %s (%d refused so far; "
                           "check the broker's ACL)", self._where, reason, self.refused)

    def _handle_message(self, _client: paho.Client, _u: Any, msg: paho.MQTTMessage) -> None:
        self._subs.deliver(msg)

    def _paho_error(self, msg: str, args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], OSError):
            self._socket_error = args[0]  # the reason a read or write failed, for on_disconnect
        elif msg.startswith("Caught exception"):
            logger.error("MQTT client: %s", msg % args)

    # -- helpers ------------------------------------------------------------------------------
    def _status(self, state: str) -> bytes:
        status: dict[str, Any] = {"state": state, "device": self.topics.device}
        if state != "offline":
            status.update(version=__version__, ts=round(time.time(), 3),
                          mqtt_protocol=self.protocol)
        if state == "online" and self._birth is not None:
            try:
                status.update(self._birth())
            except Exception:
                logger.exception("MQTT birth fields failed; announcing without them")
        return json.dumps(status, default=str).encode()

    def _send_status(self, client: paho.Client, state: str) -> paho.MQTTMessageInfo:
        info = client.publish(self.topics.status, self._status(state), qos=1, retain=True)
        self._acks.claim(info.mid, _noop)  # so that its PUBACK is not kept as an early one
        return info

    def _down_state(self) -> str:
        return "disconnected" if self._ever_connected else "connecting"

    def _next_retry(self) -> None:
        # paho waits its min delay after reconnect_delay_set(); ours adds the jitter paho lacks.
        delay = self._backoff.next_delay()
        self._backoff.attempts += 1
        if self._paho is not None:
            self._paho.reconnect_delay_set(delay, delay)  # type: ignore[arg-type]

    def _report(self, state: str, error: str) -> None:
        self.state, self.last_error = state, error
        self._failures.report(state, error)
