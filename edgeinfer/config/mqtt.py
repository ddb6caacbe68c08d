"""Typed config of the ``mqtt:`` section: the broker connection, topics, the durable outbox,
commands and Home Assistant discovery. Field names are a contract."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from .commands import CommandsConfig
from ._types import ConfigStruct, DAY, ClientId, FilePath, Host, MiB, Port, Text, TopicPath
from .pipeline import ReconnectConfig

__all__ = ["HomeAssistantConfig", "MqttConfig", "OutboxConfig", "TlsConfig"]


class TlsConfig(ConfigStruct, frozen=True):
    """TLS to the broker.

    Attributes:
        ca_file: CA bundle that signed the broker's certificate (``None``: the system's).
        cert_file, key_file: A client certificate and its key, for brokers that require one.
        min_version: Oldest TLS version accepted.
        verify_hostname: Check the broker's certificate names ``host``. Turn off only for a
            broker reached by an address its certificate does not name; the CA is still checked.
    """

    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None
    min_version: Literal["1.2", "1.3"] = "1.2"
    verify_hostname: bool = True

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give both `cert_file` and `key_file`, or neither")


class OutboxConfig(ConfigStruct, frozen=True):
    """The durable outbox every result goes through (SQLite, WAL) before it is published.

    A result leaves the outbox only when the broker acknowledged it (PUBACK). When a bound is
    reached the oldest results are dropped, counted and reported on stats and status.

    Attributes:
        path: The database file (default ``<state_dir>/outbox-<device>@<host>-<port>.sqlite3``:
            one per device and broker, see ``edgeinfer.paths.outbox_path``).
        max_messages: At most this many results wait.
        max_mb: At most this much payload waits.
        max_age_s: Results older than this are dropped (``None``: kept until sent or pushed out).
        replay_rate: Backlog messages per second published after an outage, besides live ones.
    """

    path: FilePath | None = None
    max_messages: Annotated[int, Meta(ge=1, le=100_000_000)] = 100_000
    max_mb: MiB = 64.0
    max_age_s: Annotated[float, Meta(ge=1, le=90 * DAY)] | None = 7 * DAY
    replay_rate: Annotated[float, Meta(ge=0.1, le=100_000)] = 500.0


class HomeAssistantConfig(ConfigStruct, frozen=True):
    """Home Assistant MQTT discovery (opt-in).

    Attributes:
        enabled: Publish retained discovery configs for this device and its pipelines.
        prefix: Home Assistant's discovery prefix.
    """

    enabled: bool = False
    prefix: TopicPath = "homeassistant"


class MqttConfig(ConfigStruct, frozen=True):
    """The broker connection and what edgeinfer publishes and answers there.

    Attributes:
        host, port: The broker (default port 1883, or 8883 with ``tls``).
        embedded: Start a small MQTT broker inside the process on ``host``/``port`` (loopback
            by default): for the demo and for a device with no broker. Needs the ``broker``
            extra.
        protocol: ``auto`` (MQTT 5, falling back to 3.1.1 when the broker refuses it or does
            not answer), ``v5`` (MQTT 5 only) or ``v3.1.1``.
        client_id: Default ``edgeinfer-<device_id>``.
        username, password: ``password`` is best given as ``${credential:mqtt_password}`` (a
            systemd credential) or ``${ENV_VAR}``; it is never logged.
        keepalive_s: Seconds between keepalive pings.
        tls: TLS settings; ``None``: plain TCP.
        prefix: First topic level: ``<prefix>/<device_id>/...``.
        reconnect: Backoff while the broker is unreachable (with jitter; never gives up).
        stats_interval_s: How often ``<prefix>/<device>/stats`` is published.
        outbox: The durable outbox.
        commands: Answer commands on ``<prefix>/<device>/cmd/<verb>``: ``true``, ``false``, or
            a policy (`CommandsConfig`: allowed and signed verbs).
        max_command_bytes: Larger command payloads are refused.
        homeassistant: Home Assistant discovery.
    """

    host: Host = "127.0.0.1"
    port: Port | None = None
    embedded: bool = False
    protocol: Literal["auto", "v5", "v3.1.1"] = "auto"
    client_id: ClientId | None = None
    username: Text | None = None
    password: str | None = None
    keepalive_s: Annotated[int, Meta(ge=5, le=3600)] = 60
    tls: TlsConfig | None = None
    prefix: TopicPath = "edgeinfer"
    reconnect: ReconnectConfig = msgspec.field(
        default_factory=lambda: ReconnectConfig(initial_s=1.0, max_s=60.0))
    stats_interval_s: Annotated[float, Meta(ge=0.1, le=DAY)] = 30.0
    outbox: OutboxConfig = msgspec.field(default_factory=OutboxConfig)
    commands: bool | CommandsConfig = True
    max_command_bytes: Annotated[int, Meta(ge=64, le=16_777_216)] = 65536
    homeassistant: HomeAssistantConfig = msgspec.field(default_factory=HomeAssistantConfig)

    def resolved_port(self) -> int:
        return self.port or (8883 if self.tls is not None else 1883)
