"""The collector's MQTT 5 source: a shared subscription (``$share/<group>/<prefix>/+/+/result``
and ``.../event``) split between the collectors of one group, plus a plain subscription to the
retained ``<prefix>/+/status`` (a shared subscription gets no retained messages in MQTT 5;
every collector writes every status, an idempotent upsert).

Acknowledgements are manual (``manual_ack``): a message is acknowledged only when the
collector committed it. The session is persistent (``clean_start=False``, a stable client id,
``SessionExpiryInterval``), so messages not yet acknowledged when a collector dies, and those
that arrive while it is away, are sent again when it comes back. ``ReceiveMaximum`` caps the
unacknowledged messages in flight; keep it at least twice ``batch.max_rows`` and at most
``batch.queue``: then the queue never fills, so paho's network thread never blocks in
`deliver` and keeps the connection alive (a thread blocked longer than 1.5 keepalives would be
disconnected by the broker; nothing is lost then, the messages come again).

A message that does not parse (anything it raises) is delivered as rejected: parked and
acknowledged by the collector, never retried. An exception anywhere else in paho's network
thread would end that thread and leave the collector connected to nothing: it is caught,
logged, and reported by `MqttSource.failure`, which stops the collector. A connection that
cannot be made is logged (address and reason; the first, then at most every 30 s).

Each token carries the connection's generation. After any disconnect the broker resends what
was unacknowledged (with the same session) or dropped it (a new session), and its packet ids
may be reused for other messages: acknowledgements of an earlier connection are never sent.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .records import Delivery, parse, rejection, source_of

if TYPE_CHECKING:
    from ..config.collect import MqttSourceConfig

__all__ = ["MqttSource", "subscriptions"]

logger = logging.getLogger(__name__)

_KEEPALIVE_S = 30
_CONNECT_LOG_EVERY_S = 30.0


def subscriptions(config: MqttSourceConfig) -> list[str]:
    """The topic filters a collector subscribes to (shared results and events, plain status)."""
    shared = f"$share/{config.group}/{config.prefix}"
    return [f"{shared}/+/+/result", f"{shared}/+/+/event", f"{config.prefix}/+/status"]


class MqttSource:
    """Reads device messages from an MQTT 5 broker for a `Collector`.

    Args:
        config: The ``source:`` section (``type: mqtt``).

    Raises:
        ConfigError: paho-mqtt is not installed, or the TLS files cannot be loaded (`start`).
    """

    def __init__(self, config: MqttSourceConfig) -> None:
        self.config = config
        self._client: Any = None
        self._deliver: Callable[[Delivery], None] | None = None
        self._lock = threading.Lock()
        self._generation = 0
        self._connected = threading.Event()  # connected and subscribed
        self._subscribe_mid = -1
        self._counts = {"messages": 0, "rejected": 0, "connects": 0, "disconnects": 0,
                        "sessions_lost": 0, "acks": 0, "stale_acks": 0}
        self.last_reject = ""
        self._failure: str | None = None
        self._connect_failures = 0
        self._connect_logged = 0.0

    def start(self, deliver: Callable[[Delivery], None]) -> None:
        """Connect (in the background; paho reconnects on its own) and start delivering."""
        if self._client is not None:
            raise ConfigError("MqttSource.start: already started")
        try:
            import paho.mqtt.client as mqtt
            from paho.mqtt.enums import CallbackAPIVersion
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties
        except ImportError as exc:
            raise ConfigError("source.type mqtt needs paho-mqtt; install it with "
                              "pip install 'edgeinfer[collect]'") from exc
        c = self.config
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=c.client_id,
                             protocol=mqtt.MQTTv5, manual_ack=True)
        if c.username is not None:
            client.username_pw_set(c.username, c.password)
        if c.tls is not None:
            from ..mqtt._connection import ssl_context

            client.tls_set_context(ssl_context(c.tls))
        client.reconnect_delay_set(1, 30)
        client.on_connect = self._guarded(self._on_connect)
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._guarded(self._on_disconnect)
        client.on_subscribe = self._guarded(self._on_subscribe)
        client.on_message = self._guarded(self._on_message)
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = c.session_expiry_s
        props.ReceiveMaximum = c.receive_maximum
        self._deliver = deliver
        self._client = client
        port = c.port or (8883 if c.tls is not None else 1883)
        client.connect_async(c.host, port, keepalive=_KEEPALIVE_S, clean_start=False,
                             properties=props)
        client.loop_start()

    def wait_connected(self, timeout: float | None = None) -> bool:
        """Whether the broker accepted the connection and the subscriptions within
        ``timeout`` s (a message published before then may not reach a new session)."""
        return self._connected.wait(timeout)

    def ack(self, tokens: Sequence[Any]) -> None:
        """Acknowledge delivered messages (tokens in delivery order); those of an earlier
        connection are skipped (the broker sends them again, or they went with the session)."""
        client = self._client
        if client is None:
            return
        sent = stale = 0
        with self._lock:
            generation = self._generation
            for token_generation, mid, qos in tokens:
                if token_generation != generation:
                    stale += 1
                    continue
                client.ack(mid, qos)
                sent += 1
            self._counts["acks"] += sent
            self._counts["stale_acks"] += stale

    def stop(self) -> None:
        """Disconnect (the session stays on the broker for ``session_expiry_s``)."""
        client, self._client = self._client, None
        if client is None:
            return
        with self._lock:
            self._generation += 1
        client.disconnect()
        client.loop_stop()

    def stats(self) -> dict[str, Any]:
        """Messages, rejected, connects, disconnects, failed connection attempts, sessions
        lost, acks sent and acks skipped as stale; whether connected now (never after a
        `failure`)."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            out["generation"] = self._generation
            out["connect_failures"] = self._connect_failures
        out["connected"] = self._connected.is_set() and self._failure is None
        return out

    def failure(self) -> str | None:
        """What broke paho's network thread (an exception in a callback), or ``None``."""
        return self._failure

    def _guarded(self, callback: Callable[..., None]) -> Callable[..., None]:
        def guarded(*args: Any) -> None:
            try:
                callback(*args)
            except Exception as exc:  # paho would end its thread on it: report, never deaf
                self._failure = f"{callback.__name__}: {type(exc).__name__}: {exc}"
                self._connected.clear()
                logger.error("MQTT source failed in %s", callback.__name__, exc_info=True)

        return guarded

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        # paho calls this inside its `except OSError`: the exception in hand is the reason.
        reason = sys.exc_info()[1]
        now = time.monotonic()
        with self._lock:
            self._connect_failures += 1
            failures = self._connect_failures
            due = failures == 1 or now - self._connect_logged >= _CONNECT_LOG_EVERY_S
            if due:
                self._connect_logged = now
        if due:
            c = self.config
            logger.warning("cannot connect to the MQTT broker at %s:%d (%s); %d attempts so "
                           "far, retrying", c.host, c.port or (8883 if c.tls else 1883),
                           reason or "no reason given", failures)

    # paho's network thread from here on

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any,
                    properties: Any) -> None:
        if reason.is_failure:
            logger.warning("broker %s:%s refused the connection: %s", self.config.host,
                           self.config.port, reason)
            return
        with self._lock:
            self._generation += 1
            self._counts["connects"] += 1
            if not flags.session_present:
                self._counts["sessions_lost"] += 1
        if not flags.session_present:
            # First start, or the broker forgot the session: messages not acknowledged before
            # are gone with it (or were never sent); only a long session expiry prevents this.
            logger.info("new MQTT session for %s (no earlier session on the broker)",
                        self.config.client_id)
        _, self._subscribe_mid = client.subscribe(
            [(topic, self.config.qos) for topic in subscriptions(self.config)])

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, reasons: Any,
                      properties: Any) -> None:
        if mid == self._subscribe_mid:
            self._connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any,
                       properties: Any) -> None:
        self._connected.clear()
        with self._lock:
            self._generation += 1
            self._counts["disconnects"] += 1
        if self._client is not None:
            logger.warning("broker connection lost (%s); reconnecting", reason)

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        with self._lock:
            generation = self._generation
            self._counts["messages"] += 1
        received = time.time()
        topic, parked = "(a topic that is not UTF-8)", None
        try:
            topic = message.topic  # paho decodes it here: it may raise
            record = parse(topic, message.payload, self.config.prefix, received)
        except Exception as exc:  # whatever one message makes parse raise: that message's fault
            record, parked = None, rejection(topic, message.payload, exc, received,
                                             source_of(topic, self.config.prefix))
            with self._lock:
                self._counts["rejected"] += 1
            self.last_reject = parked.reason
        deliver = self._deliver
        if deliver is not None:
            deliver(Delivery(record, (generation, message.mid, message.qos),
                             bool(message.dup), parked))
