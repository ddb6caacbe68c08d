"""The daemon's MQTT side: an embedded broker when asked, the client with its durable outbox,
the retained status, periodic stats, commands and Home Assistant discovery.

    link = MqttLink(config, host); link.start()     # before the pipelines (MQTT sources)
    ... the daemon builds pipelines with link.context() ...
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
from collections.abc import Callable
from typing import Any

from ..version import __version__
from ..config import Config
from ..config.commands import CommandsConfig
from ..config.pipeline import MqttSource
from ..errors import ConfigError, StateError
from ..host import Host
from ..keys import load_trusted_keys
from ..mqtt.client import Message, MqttClient
from ..mqtt.discovery import config_filter, discovery_messages
from ..mqtt.embedded import EmbeddedBroker
from ..mqtt.publisher import MqttPlumbing
from ..nonces import NonceBook
from ..ota.protocol import MAX_CHUNK, MAX_OFFER_BYTES
from .commands import CommandServer, Handler, command_policy
from .handlers import CommandHandlers
from .signed import SignedCommands
from .status import backend_of, device_birth, device_stats, pipeline_health

logger = logging.getLogger(__name__)

PACKET_OVERHEAD = 4096  # an MQTT packet's bytes besides its payload: topic, properties
MQTT_SOURCE_BYTES = 1024 * 1024  # largest reading an MQTT source pipeline takes

# What the birth and discovery are made from: configured pipelines with their task, running
# ones, failed ones, each one's backend, each one's state and reason (see _current_shape).
Shape = tuple[tuple[tuple[str, str], ...], tuple[str, ...], tuple[str, ...],
              tuple[tuple[str, str], ...], tuple[tuple[str, str, str], ...]]


class MqttLink:
    """The MQTT side of one daemon (``host``) with config ``config`` (it has ``mqtt:``)."""

    def __init__(self, config: Config, host: Host) -> None:
        assert config.mqtt is not None
        self.config = config
        self.mqtt = config.mqtt
        self.host = host
        self.device_id = config.resolved_device_id()
        self.broker: EmbeddedBroker | None = None
        self.plumbing: MqttPlumbing | None = None
        self.commands: CommandServer | None = None
        self._next_stats = 0.0
        self._started = time.monotonic()
        self._ha_unsubscribe: list[Callable[[], None]] = []
        self._discovery_lock = threading.Lock()
        self._discovery_topics: set[str] = set()  # the configs this device has now
        self._shape: Shape | None = None  # what the birth and discovery were last made from
        self._opener: SignedCommands | None = None
        self._reported: str | None = None  # the problem last announced on the status topic
        self._counts: dict[str, Any] = {}  # pipeline -> the counts last published (retained)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        mqtt = self.mqtt
        self._opener = self._signed_commands()
        if mqtt.embedded:
            self.broker = EmbeddedBroker.from_config(mqtt)
            self.broker.start()
        client = MqttClient(mqtt, self.device_id, birth=self.birth,
                            max_packet_bytes=max_packet_bytes(self.config))
        self.plumbing = MqttPlumbing(mqtt, self.device_id,
                                     self.config.runtime.resolved_state_dir(), client=client)
        self.plumbing.start()
        self._next_stats = time.monotonic() + mqtt.stats_interval_s
        policy = command_policy(mqtt)
        if policy is not None:  # listening before the pipelines start, answering from ready()
            self.commands = CommandServer(client, self.handlers(),
                                          max_bytes=mqtt.max_command_bytes,
                                          allow=policy.allow, signed=policy.signed,
                                          opener=self._opener)
            self.commands.listen()

    def context(self) -> dict[str, Any]:
        """What sources and sinks get: ``mqtt`` for MQTT sinks, ``subscribe`` for MQTT sources."""
        plumbing = self._plumbing()
        client = plumbing.client

        def subscribe(topic: str, qos: int,
                      on_payload: Callable[[bytes], None]) -> Callable[[], None]:
            return client.subscribe(topic, qos, lambda message: on_payload(message.payload))

        return {"mqtt": plumbing, "subscribe": subscribe}

    def last_seq(self, pipeline: str) -> int:
        return int(self._plumbing().last_seq(pipeline))

    def _plumbing(self) -> MqttPlumbing:
        if self.plumbing is None:
            raise StateError("the MQTT link is not started: call start() first")
        return self.plumbing

    def _client(self) -> MqttClient:
        client: MqttClient = self._plumbing().client
        return client

    def ready(self) -> None:
        """The pipelines run: announce them, answer commands, publish discovery."""
        client = self._client()
        if self.commands is not None:  # subscribed since start(): "online" means answered,
            self.commands.start()      # and a command sent on seeing a result waited for this
        self._shape = self._current_shape()
        self.publish_birth()
        if self.mqtt.homeassistant.enabled:
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

    def _current_shape(self) -> Shape:
        """(configured pipelines with their task, running ones, failed ones, the backend each
        runs on: a measured backend swapped in shows on the status topic, and each one's state
        and reason: a camera lost or back shows there, and in Home Assistant's availability)."""
        return (tuple(sorted(self._configured().items())),
                tuple(sorted(p.name for p in self.host.pipelines)),
                tuple(sorted(self.host.failed)),
                tuple(sorted((p.name, backend_of(p.model)["choice"])
                             for p in self.host.pipelines if not p.model.closed)),
                tuple(sorted((name, h["state"], h["reason"])
                             for name, h in pipeline_health(self.host).items())))

    def _configured(self) -> dict[str, str]:
        """Configured pipeline -> task type: discovery covers a pipeline that failed to start
        too, so that a transient failure does not remove its entities."""
        return {pc.name: str(type(pc.task).__struct_config__.tag)
                for pc in self.host.config.pipelines}

    def _scenes(self) -> dict[str, tuple[list[str], list[str]]]:
        """Configured pipeline -> (zone names, line names), for discovery."""
        return {pc.name: ([z.name for z in pc.zones], [ln.name for ln in pc.lines])
                for pc in self.host.config.pipelines if pc.zones or pc.lines}

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
            **device_birth(self.host, self.device_id),
            "outbox": self.plumbing.birth_info() if self.plumbing is not None else None,
            "mqtt_protocol": self.plumbing.client.protocol if self.plumbing is not None else None,
            "commands": None if self.commands is None else self.commands.stats()["state"],
            "problem": self.problem(),
        }

    def publish_birth(self) -> None:
        """Publish the retained birth again (the models changed: an update)."""
        client = self._client()
        client.publish(client.topics.status, json.dumps(self.birth_message()), qos=1,
                       retain=True)

    def stats_message(self) -> dict[str, Any]:
        return {
            **device_stats(self.host, self.device_id, self._started),
            "outbox": self._plumbing().stats(),
            "commands": self.commands.stats() if self.commands else None,
        }

    def publish_stats(self) -> None:
        client = self._client()
        client.publish(client.topics.stats, json.dumps(self.stats_message(), default=str), qos=0)

    def publish_counts(self) -> None:
        """Publish each pipeline's zone and line counts, retained, when they changed (checked
        every tick: at most a few messages a second, never from the data plane). A
        reconnected client sends them again."""
        client = self._client()
        reconnected = client.reconnects != self._counts.get("\0reconnects")
        self._counts["\0reconnects"] = client.reconnects
        for p in self.host.pipelines:
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
        client = self._client()
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

    def _on_ha_status(self, message: Message) -> None:
        if message.payload.strip().lower() == b"online":
            self.publish_discovery()

    def _on_config(self, message: Message) -> None:
        """A retained config of this device the broker holds: cleared when it is not one of
        ours now (its pipeline was removed while the daemon was stopped or disconnected)."""
        with self._discovery_lock:
            stale = (message.retain and message.payload
                     and message.topic not in self._discovery_topics)
        if stale:
            logger.info("clearing Home Assistant discovery config %s (no such pipeline now)",
                        message.topic)
            self._client().publish(message.topic, b"", qos=1, retain=True)

    # -- commands -------------------------------------------------------------------------------
    def handlers(self) -> dict[str, Handler]:
        return CommandHandlers(self.host, status=self.status_message,
                               publish_snapshot=self.publish_snapshot).table()

    def status_message(self) -> dict[str, Any]:
        """What the ``status`` command answers: the birth plus the current stats."""
        return {**self.birth_message(), "stats": self.stats_message()}

    def publish_snapshot(self, pipeline: str, jpeg: bytes) -> dict[str, Any]:
        """Publish a snapshot's JPEG on its topic; returns what the command's reply adds."""
        client = self._client()
        topic = client.topics.snapshot(pipeline)
        client.publish(topic, jpeg, qos=1, properties={"content_type": "image/jpeg"})
        return {"topic": topic}

    # -- policy ---------------------------------------------------------------------------------
    def _signed_commands(self) -> SignedCommands | None:
        """What checks signed commands, when the policy names signed verbs.

        Raises:
            ConfigError: signed verbs, but no ``ota.trusted_keys`` to check them with.
        """
        policy: CommandsConfig | None = command_policy(self.mqtt)
        if policy is None or not policy.signed:
            return None
        trusted = load_trusted_keys(self.config.ota.trusted_keys) if self.config.ota else {}
        if not trusted:
            raise ConfigError(f"mqtt.commands.signed: {NO_KEYS}")
        nonces = NonceBook(self.config.runtime.resolved_state_dir() / "command-nonces.json")
        return SignedCommands(self.device_id, trusted, nonces, max_age_s=policy.max_age_s)


NO_KEYS = ("signed commands are checked with the keys of ota.trusted_keys; add an ota: section "
           "with trusted_keys")


def signed_commands_problem(config: Config) -> str | None:
    """Why the signed verbs of ``config``'s command policy could never be checked (no ``ota:``
    section, so no keys), or ``None``; ``edgeinfer validate-config`` asks it as the start does."""
    policy = command_policy(config.mqtt)
    if policy is None or not policy.signed or config.ota is not None:
        return None
    return NO_KEYS


def max_packet_bytes(config: Config) -> int:
    """The largest MQTT packet the daemon takes: its largest command, OTA offer or chunk, or
    MQTT source reading, plus `PACKET_OVERHEAD`."""
    assert config.mqtt is not None
    need = config.mqtt.max_command_bytes
    if config.ota is not None:
        need = max(need, MAX_OFFER_BYTES, MAX_CHUNK)
    if any(isinstance(p.source, MqttSource) for p in config.pipelines):
        need = max(need, MQTT_SOURCE_BYTES)
    return need + PACKET_OVERHEAD
