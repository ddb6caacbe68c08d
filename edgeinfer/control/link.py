"""The daemon's MQTT side: an embedded broker when asked, the client with its durable outbox,
the retained status, periodic stats, commands and Home Assistant discovery.

    link = MqttLink(config, daemon); link.start()   # before the pipelines (MQTT sources)
    ... daemon builds pipelines with link.context() ...
    link.ready()                                    # birth with the pipelines, commands, discovery
    link.tick()                                     # from the daemon's tick: stats when due
    link.problem()                                  # why the link is unhealthy, or None
    link.stop(flush_s)                              # flush the outbox, "stopped", disconnect
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import ConfigError
from .commands import CommandServer
from .status import backend_of, device_birth, device_stats, pipeline_health

if TYPE_CHECKING:
    from ..config import Config
    from ..daemon import Daemon

logger = logging.getLogger(__name__)

PACKET_OVERHEAD = 4096  # an MQTT packet's bytes besides its payload: topic, properties
MQTT_SOURCE_BYTES = 1024 * 1024  # largest reading an MQTT source pipeline takes


class MqttLink:
    def __init__(self, config: Config, daemon: Daemon) -> None:
        assert config.mqtt is not None
        self.config = config
        self.mqtt = config.mqtt
        self.daemon = daemon
        self.device_id = config.resolved_device_id()
        self.broker: Any = None
        self.plumbing: Any = None
        self.commands: CommandServer | None = None
        self._next_stats = 0.0
        self._started = time.monotonic()
        self._ha_unsubscribe: list[Any] = []
        self._discovery_lock = threading.Lock()
        self._discovery_topics: set[str] = set()  # the configs this device has now
        self._shape: Any = None  # what the birth and discovery were last made from
        self._opener: Any = None
        self._reported: str | None = None  # the problem last announced on the status topic
        self._counts: dict[str, Any] = {}  # pipeline -> the counts last published (retained)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        from ..mqtt.client import MqttClient
        from ..mqtt.publisher import MqttPlumbing

        mqtt = self.mqtt
        self._opener = self._signed_commands()
        if mqtt.embedded:
            from ..mqtt.embedded import EmbeddedBroker

            self.broker = EmbeddedBroker.from_config(mqtt)
            self.broker.start()
        client = MqttClient(mqtt, self.device_id, birth=self.birth,
                            max_packet_bytes=max_packet_bytes(self.config))
        self.plumbing = MqttPlumbing(mqtt, self.device_id,
                                     self.config.runtime.resolved_state_dir(), client=client)
        self.plumbing.start()
        self._next_stats = time.monotonic() + mqtt.stats_interval_s

    def context(self) -> dict[str, Any]:
        """What sources and sinks get: ``mqtt`` for MQTT sinks, ``subscribe`` for MQTT sources."""
        client = self.plumbing.client

        def subscribe(topic: str, qos: int, on_payload: Any) -> Any:
            return client.subscribe(topic, qos, lambda message: on_payload(message.payload))

        return {"mqtt": self.plumbing, "subscribe": subscribe}

    def last_seq(self, pipeline: str) -> int:
        return int(self.plumbing.last_seq(pipeline))

    def ready(self) -> None:
        """The pipelines run: announce them, answer commands, publish discovery."""
        client = self.plumbing.client
        policy = self._policy()
        if policy is not None:  # subscribed before the birth: "online" means commands answered
            self.commands = CommandServer(client, self.handlers(),
                                          max_bytes=self.mqtt.max_command_bytes,
                                          allow=policy.allow, signed=policy.signed,
                                          opener=self._opener)
            self.commands.start()
        self._shape = self._current_shape()
        self.publish_birth()
        if self.mqtt.homeassistant.enabled:
            from ..mqtt.discovery import config_filter

            ha = self.mqtt.homeassistant.prefix
            # After every (re)connect too: a broker down at start (or one that lost its
            # retained messages) would otherwise never get them. Hooked first: a connect
            # between the two would miss both.
            client.on_connect(self.publish_discovery)
            self.publish_discovery()
            self._ha_unsubscribe = [
                client.subscribe(f"{ha}/status", 1, self._on_ha_status),
                client.subscribe(config_filter(ha, self.device_id), 1, self._on_config)]

    def tick(self) -> None:
        now = time.monotonic()
        if now >= self._next_stats:
            self._next_stats = now + self.mqtt.stats_interval_s
            self.publish_stats()
        problem = self.problem()
        if problem != self._reported:  # a dead command thread shows on the status topic
            self._reported = problem
            self.publish_birth()
        self.publish_counts()
        shape = self._current_shape()
        if shape != self._shape:  # a reload added, removed or changed pipelines
            configured_changed = self._shape is None or shape[0] != self._shape[0]
            self._shape = shape
            self.publish_birth()
            if configured_changed and self.mqtt.homeassistant.enabled:
                self.publish_discovery()

    def _current_shape(self) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...],
                                      tuple[str, ...], tuple[tuple[str, str], ...],
                                      tuple[tuple[str, str, str], ...]]:
        """(configured pipelines with their task, running ones, failed ones, the backend each
        runs on: a measured backend swapped in shows on the status topic, and each one's state
        and reason: a camera lost or back shows there, and in Home Assistant's availability)."""
        return (tuple(sorted(self._configured().items())),
                tuple(sorted(p.name for p in self.daemon.pipelines)),
                tuple(sorted(self.daemon.failed)),
                tuple(sorted((p.name, backend_of(p.model)["choice"])
                             for p in self.daemon.pipelines if not p.model.closed)),
                tuple(sorted((name, h["state"], h["reason"])
                             for name, h in pipeline_health(self.daemon).items())))

    def _configured(self) -> dict[str, str]:
        """Configured pipeline -> task type: discovery covers a pipeline that failed to start
        too, so that a transient failure does not remove its entities."""
        return {pc.name: str(type(pc.task).__struct_config__.tag)
                for pc in self.daemon.config.pipelines}

    def _scenes(self) -> dict[str, tuple[list[str], list[str]]]:
        """Configured pipeline -> (zone names, line names), for discovery."""
        return {pc.name: ([z.name for z in pc.zones], [ln.name for ln in pc.lines])
                for pc in self.daemon.config.pipelines if pc.zones or pc.lines}

    def problem(self) -> str | None:
        """Why this link no longer does its job (the command thread died), or ``None``."""
        return self.commands.problem() if self.commands is not None else None

    def stop(self, flush_s: float = 5.0) -> None:
        for unsubscribe in self._ha_unsubscribe:
            unsubscribe()
        if self.commands is not None:
            self.commands.stop()
        if self.plumbing is not None:
            # Counts change between ticks: without this the retained counts miss what the
            # pipelines (closed by now) counted after the last tick, until the next start.
            self.publish_counts()
            self.plumbing.stop(timeout_s=flush_s)
        if self.broker is not None:
            self.broker.stop()

    # -- messages -------------------------------------------------------------------------------
    def birth(self) -> dict[str, Any]:
        """What the retained ``online`` status carries besides state and version."""
        return self.birth_message()

    def birth_message(self) -> dict[str, Any]:
        return {
            **device_birth(self.daemon, self.device_id),
            "outbox": self.plumbing.birth_info() if self.plumbing is not None else None,
            "mqtt_protocol": self.plumbing.client.protocol if self.plumbing is not None else None,
            "commands": None if self.commands is None else self.commands.stats()["state"],
            "problem": self.problem(),
        }

    def publish_birth(self) -> None:
        """Publish the retained birth again (the models changed: an update)."""
        client = self.plumbing.client
        client.publish(client.topics.status, json.dumps(self.birth_message()), qos=1,
                       retain=True)

    def stats_message(self) -> dict[str, Any]:
        return {
            **device_stats(self.daemon, self.device_id, self._started),
            "outbox": self.plumbing.stats(),
            "commands": self.commands.stats() if self.commands else None,
        }

    def publish_stats(self) -> None:
        client = self.plumbing.client
        client.publish(client.topics.stats, json.dumps(self.stats_message(), default=str), qos=0)

    def publish_counts(self) -> None:
        """Publish each pipeline's zone and line counts, retained, when they changed (checked
        every tick: at most a few messages a second, never from the data plane). A
        reconnected client sends them again."""
        client = self.plumbing.client
        reconnected = client.reconnects != self._counts.get("\0reconnects")
        self._counts["\0reconnects"] = client.reconnects
        for p in self.daemon.pipelines:
            analytics = p.analytics
            counts = analytics.counts() if analytics is not None else None
            if counts is None or (counts == self._counts.get(p.name) and not reconnected):
                continue
            if client.state != "connected":
                return  # published on the next tick after the connection is back
            self._counts[p.name] = counts
            client.publish(client.topics.counts(p.name),
                           json.dumps({"ts": round(time.time(), 3), **counts}), qos=1,
                           retain=True)

    def publish_discovery(self) -> None:
        """Publish the retained discovery configs of the configured pipelines, and clear (an
        empty retained message) those of pipelines no longer configured. Any thread."""
        from ..mqtt.discovery import discovery_messages

        client = self.plumbing.client
        messages = discovery_messages(client.topics, self.device_id, self._configured(),
                                      self.mqtt.homeassistant.prefix, __version__,
                                      scenes=self._scenes())
        with self._discovery_lock:
            gone = self._discovery_topics - {topic for topic, _ in messages}
            self._discovery_topics = {topic for topic, _ in messages}
        for topic in sorted(gone):
            client.publish(topic, b"", qos=1, retain=True)
        for topic, payload in messages:
            client.publish(topic, payload, qos=1, retain=True)

    def _on_ha_status(self, message: Any) -> None:
        if message.payload.strip().lower() == b"online":
            self.publish_discovery()

    def _on_config(self, message: Any) -> None:
        """A retained config of this device the broker holds: cleared when it is not one of
        ours now (its pipeline was removed while the daemon was stopped or disconnected)."""
        with self._discovery_lock:
            stale = (message.retain and message.payload
                     and message.topic not in self._discovery_topics)
        if stale:
            logger.info("clearing Home Assistant discovery config %s (no such pipeline now)",
                        message.topic)
            self.plumbing.client.publish(message.topic, b"", qos=1, retain=True)

    # -- commands -------------------------------------------------------------------------------
    def handlers(self) -> dict[str, Any]:
        from .handlers import CommandHandlers

        return CommandHandlers(self.daemon, status=self.status_message,
                               publish_snapshot=self._publish_snapshot).table()

    def status_message(self) -> dict[str, Any]:
        """What the ``status`` command answers: the birth plus the current stats."""
        return {**self.birth_message(), "stats": self.stats_message()}

    def _publish_snapshot(self, pipeline: str, jpeg: bytes) -> dict[str, Any]:
        client = self.plumbing.client
        topic = client.topics.snapshot(pipeline)
        client.publish(topic, jpeg, qos=1, properties={"content_type": "image/jpeg"})
        return {"topic": topic}

    # -- policy ---------------------------------------------------------------------------------
    def _policy(self) -> Any:
        """The ``CommandsConfig`` in force, or ``None`` when commands are off."""
        from ..config.commands import CommandsConfig

        commands = self.mqtt.commands
        if commands is False:
            return None
        return CommandsConfig() if commands is True else commands

    def _signed_commands(self) -> Any:
        """What checks signed commands, when the policy names signed verbs.

        Raises:
            ConfigError: signed verbs, but no ``ota.trusted_keys`` to check them with.
        """
        policy = self._policy()
        if policy is None or not policy.signed:
            return None
        from ..ota.keys import load_trusted_keys
        from ..nonces import NonceBook
        from .signed import SignedCommands

        trusted = load_trusted_keys(self.config.ota.trusted_keys) if self.config.ota else {}
        if not trusted:
            raise ConfigError("mqtt.commands.signed: signed commands are checked with the keys "
                              "of ota.trusted_keys; add an ota: section with trusted_keys")
        nonces = NonceBook(self.config.runtime.resolved_state_dir() / "command-nonces.json")
        return SignedCommands(self.device_id, trusted, nonces, max_age_s=policy.max_age_s)


def max_packet_bytes(config: Config) -> int:
    """The largest MQTT packet the daemon takes: its largest command, OTA offer or chunk, or
    MQTT source reading, plus `PACKET_OVERHEAD`."""
    from ..config.pipeline import MqttSource

    assert config.mqtt is not None
    need = config.mqtt.max_command_bytes
    if config.ota is not None:
        from ..ota.protocol import MAX_CHUNK, MAX_OFFER_BYTES

        need = max(need, MAX_OFFER_BYTES, MAX_CHUNK)
    if any(isinstance(p.source, MqttSource) for p in config.pipelines):
        need = max(need, MQTT_SOURCE_BYTES)
    return need + PACKET_OVERHEAD
