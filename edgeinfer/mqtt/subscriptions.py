"""The subscriptions of `edgeinfer.mqtt.client.MqttClient` and the routing of each received
message to them: by filter, and, for a broker that takes '.' for a topic level separator
(RabbitMQ delivers ``a/cam.1/x`` as ``a/cam/1/x``), under the name it was published with.

The subscriptions are a tuple replaced whole on every change, so paho's network thread routes
messages without a lock; the client holds its own lock around ``add`` and ``remove`` together
with its connection state. A callback that raises is logged, never propagated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import paho.mqtt.client as paho

from ._connection import call_safely
from .topics import matches, undotted

__all__ = ["Message", "Subscription", "Subscriptions"]

logger = logging.getLogger("edgeinfer.mqtt.client")  # the client's name, which log filters use


@dataclass(frozen=True, slots=True)
class Message:
    """A message received on a subscription (MQTT 5 properties ``None`` under 3.1.1)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    response_topic: str | None = None
    correlation_data: bytes | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Subscription:
    """One ``subscribe`` call: its filter, QoS and callback."""

    topic: str
    qos: int
    callback: Callable[[Message], None]


class Subscriptions:
    """Every subscription of one client, renewed by it after each reconnect.

    Args:
        where: The broker's ``host:port``, for the log.
    """

    def __init__(self, where: str) -> None:
        self._where = where
        self._subs: tuple[Subscription, ...] = ()
        self._dotted_warned: set[str] = set()  # filters a '.'-mapping broker was seen for

    def add(self, topic: str, qos: int, callback: Callable[[Message], None]) -> Subscription:
        sub = Subscription(topic, qos, callback)
        self._subs += (sub,)
        return sub

    def remove(self, sub: Subscription) -> bool:
        """Drop ``sub``; ``True`` while another subscription keeps its filter."""
        self._subs = tuple(s for s in self._subs if s is not sub)
        return any(s.topic == sub.topic for s in self._subs)

    def qos(self, topic: str) -> int:
        """The highest QoS asked for filter ``topic``."""
        return max(s.qos for s in self._subs if s.topic == topic)

    def filters(self) -> dict[str, int]:
        """Each filter with the highest QoS asked for it: what a connect subscribes to."""
        subs: dict[str, int] = {}
        for s in self._subs:
            subs[s.topic] = max(subs.get(s.topic, 0), s.qos)
        return subs

    def deliver(self, msg: paho.MQTTMessage) -> None:
        """Hand ``msg`` to every subscription whose filter matches it (network thread)."""
        topic = msg.topic
        message: Message | None = None
        for sub in self._subs:
            if matches(sub.topic, topic):
                if message is None:
                    message = _message(topic, msg)
                call_safely(sub.callback, "subscription", message)
        if message is None and "." not in topic:
            self._deliver_dotted(msg)

    def _deliver_dotted(self, msg: paho.MQTTMessage) -> None:
        """A message no filter matches as it came: RabbitMQ delivers ``a/cam.1/x`` as
        ``a/cam/1/x``. Handed to the filters it was for, under the name it was published with,
        and said once per filter: every other client sees the broker's spelling."""
        for sub in self._subs:
            topic = undotted(sub.topic, msg.topic) if "." in sub.topic else None
            if topic is None:
                continue
            if sub.topic not in self._dotted_warned:
                self._dotted_warned.add(sub.topic)
                logger.warning("MQTT broker %s delivered %s for the subscription %s: it takes "
                               "'.' for a topic level separator (RabbitMQ does), so other "
                               "clients see such topics with '/'; use a device id, pipeline "
                               "names and prefix without '.'", self._where, msg.topic, sub.topic)
            call_safely(sub.callback, "subscription", _message(topic, msg))


def _message(topic: str, msg: paho.MQTTMessage) -> Message:
    props = msg.properties
    return Message(topic, bytes(msg.payload), msg.qos, bool(msg.retain),
                   getattr(props, "ResponseTopic", None),
                   getattr(props, "CorrelationData", None))
