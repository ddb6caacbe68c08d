"""``type: mqtt``: results published on ``<prefix>/<device>/<pipeline>/result`` (and scene
events on ``.../<pipeline>/event``) through the durable outbox. ``write`` only puts the result
on disk and wakes the publisher: it never waits for the network, and a result put survives a
crash of the process and an outage of the broker.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..frames import Result
from .base import Sink

if TYPE_CHECKING:
    from ..config.pipeline import MqttSink as MqttSinkConfig
    from ..mqtt.publisher import MqttPlumbing

__all__ = ["MqttSink"]


class MqttSink(Sink):
    """Puts each result into the daemon's outbox.

    Args:
        config: The sink's config (``qos``).
        mqtt: The daemon's ``MqttPlumbing`` (anything with ``.client``, ``.outbox`` and
            ``.publisher``).

    Seq continuity: results keep counting up across restarts of the daemon. When a pipeline
    starts counting at 1 again while the outbox remembers a higher seq for it, this sink
    numbers its results on from there (other sinks then show the pipeline's own count; the
    daemon avoids that by starting the pipeline at ``mqtt.last_seq(name) + 1``).

    Raises:
        ConfigError: no ``mqtt:`` section, so no plumbing was given.
    """

    def __init__(self, config: MqttSinkConfig, *, mqtt: MqttPlumbing | None = None,
                 **_: Any) -> None:
        super().__init__(config)
        if mqtt is None:
            raise ConfigError("an mqtt sink needs the mqtt: section")
        self._outbox = mqtt.outbox
        self._publisher = mqtt.publisher
        self._topics = mqtt.client.topics
        self._qos = int(getattr(config, "qos", 1))
        self._pipelines: dict[str, tuple[str, int]] = {}  # name -> (topic, seq offset)
        self._events: dict[str, tuple[str, int]] = {}  # outbox key -> (topic, last seq)

    def write(self, result: Result) -> None:
        name = result.pipeline
        known = self._pipelines.get(name)
        if known is None:
            known = self._pipelines[name] = (self._topics.result(name), self._offset(result))
        topic, offset = known
        if offset:
            result = dataclasses.replace(result, seq=result.seq + offset)
        self._outbox.put(name, result.seq, topic, result.to_json(), self._qos)
        self._publisher.wake()
        self.written += 1

    def write_event(self, pipeline: str, event: dict[str, Any]) -> None:
        """Put one event into the outbox for ``<prefix>/<dev>/<pipeline>/event`` (QoS 1
        always: an event is never sent at most once). Events number their own ``seq``,
        continuing across restarts like results."""
        import msgspec

        key = f"{pipeline}/event"  # pipeline names hold no '/': a key of its own in the outbox
        known = self._events.get(key)
        if known is None:
            known = (self._topics.event(pipeline), self._outbox.last_seq(key))
        topic, seq = known[0], known[1] + 1
        self._events[key] = (topic, seq)
        self._outbox.put(key, seq, topic, msgspec.json.encode({**event, "seq": seq}), 1)
        self._publisher.wake()

    def _offset(self, first: Result) -> int:
        last = self._outbox.last_seq(first.pipeline)
        return last if first.seq <= last else 0
