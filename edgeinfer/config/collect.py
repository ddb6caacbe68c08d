"""Typed config of ``edgeinfer collect -c collect.yaml``: the fleet collector that writes every
device's results, events and status into PostgreSQL (``docs/fleet.md``). Field names are a
contract. Read with `load_collect_config` (the same YAML rules, substitutions and path-naming
errors as the device config)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ._types import DAY, ClientId, ConfigStruct, Host, Port, Text, TopicPath
from .mqtt import TlsConfig

__all__ = ["BatchConfig", "CollectConfig", "CollectMetricsConfig", "DatabaseConfig",
           "MqttSourceConfig", "NatsSourceConfig", "RejectedLimits"]

Name = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}(?![\s\S])")]


class RejectedLimits(ConfigStruct, frozen=True):
    """How much of the ``rejected`` table any client on the broker may fill. A message's
    *source* is the device level of its topic (the broker does not tell a subscriber who
    published); messages past a cap are counted per source in ``rejected_sources``, with the
    latest one's payload as a sample, and not stored.

    Attributes:
        per_source: Rows a source may have in ``rejected``.
        max_rows: Rows ``rejected`` may hold in all.
        max_sources: Sources ``rejected_sources`` counts one by one; further ones are counted
            together as the source ``*``.
        payload_bytes: Bytes of a payload stored (in ``rejected`` and as a sample).
    """

    per_source: Annotated[int, Meta(ge=1, le=1_000_000)] = 100
    max_rows: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    max_sources: Annotated[int, Meta(ge=1, le=10_000_000)] = 10_000
    payload_bytes: Annotated[int, Meta(ge=0, le=64 * 1024)] = 4096


class DatabaseConfig(ConfigStruct, frozen=True):
    """PostgreSQL.

    Attributes:
        dsn: A libpq connection string or URL (``postgresql://user@host:5432/db``); its
            password is best left out and given as ``password``.
        password: ``${credential:pg_password}`` or ``${ENV}``; never logged.
        schema: The schema the tables live in (created if missing).
        partition: Results and events tables are partitioned by ``day`` or ``month`` of their
            device time.
        retention_days: Rows received longer ago than this are deleted (whole partitions
            dropped when every row of theirs is), parked rejected messages and their counts
            too, and devices whose newest status is older (``None``: kept).
        connect_timeout_s: How long a connection attempt may take.
        status_max_bytes: A status longer than this is stored summarised: its top-level
            fields that fit (``state``, ``version``, ``ts`` first), and ``_truncated`` saying
            its size and what was left out.
        rejected: The caps of the ``rejected`` table.
    """

    dsn: Text
    password: Text | None = None
    schema: Name = "edgeinfer"
    partition: Literal["day", "month"] = "day"
    retention_days: Annotated[int, Meta(ge=1, le=36500)] | None = 90
    connect_timeout_s: Annotated[float, Meta(ge=0.5, le=300)] = 10.0
    status_max_bytes: Annotated[int, Meta(ge=1024, le=1024 * 1024)] = 64 * 1024
    rejected: RejectedLimits = msgspec.field(default_factory=RejectedLimits)


class MqttSourceConfig(ConfigStruct, frozen=True, tag="mqtt", tag_field="type"):
    """Read the devices' topics from an MQTT 5 broker through a shared subscription.

    Attributes:
        host, port, username, password, tls: The broker (as a device's ``mqtt:``).
        prefix: The devices' topic prefix.
        group: The shared subscription group (``$share/<group>/...``): collectors in one group
            split the messages.
        client_id: This collector's stable id (a persistent session: messages that arrive
            while it is down wait on the broker for it). Give each collector its own.
        session_expiry_s: How long the broker keeps the session of a collector that is gone.
        receive_maximum: Unacknowledged messages the broker may send at once (at least twice
            ``batch.max_rows``: the writer acks only after the database commit).
        qos: Subscription QoS (1: at least once; the database drops duplicates).
    """

    host: Host = "127.0.0.1"
    port: Port | None = None
    username: Text | None = None
    password: Text | None = None
    tls: TlsConfig | None = None
    prefix: TopicPath = "edgeinfer"
    group: Name = "edgeinfer-collect"
    client_id: ClientId = "edgeinfer-collector-1"
    session_expiry_s: Annotated[int, Meta(ge=0, le=4_294_967_295)] = 7 * 86400
    receive_maximum: Annotated[int, Meta(ge=1, le=65535)] = 10_000
    qos: Literal[1, 2] = 1


class NatsSourceConfig(ConfigStruct, frozen=True, tag="nats", tag_field="type"):
    """Read the devices' MQTT messages from a NATS (JetStream) cluster with a durable pull
    consumer: collectors with the same ``durable`` share the work, and a collector that dies
    has its unacknowledged messages redelivered to the others.

    Attributes:
        servers: NATS URLs of the cluster (any may be down).
        stream: The JetStream stream holding the MQTT messages (nats-server's MQTT
            implementation keeps them in ``$MQTT_msgs``).
        durable: The durable consumer's name (shared by every collector).
        prefix: The devices' topic prefix (MQTT ``/`` is ``.`` in NATS subjects).
        ack_wait_s: A message not acknowledged this long after delivery is redelivered.
        user, password, token: NATS credentials.
    """

    servers: Annotated[list[Text], Meta(min_length=1, max_length=32)]
    stream: Text = "$MQTT_msgs"
    durable: Name = "edgeinfer-collect"
    prefix: TopicPath = "edgeinfer"
    ack_wait_s: Annotated[float, Meta(ge=1, le=DAY)] = 30.0
    user: Text | None = None
    password: Text | None = None
    token: Text | None = None


class BatchConfig(ConfigStruct, frozen=True):
    """How the writer groups messages into transactions.

    Attributes:
        max_rows: A batch is written when it holds this many messages ...
        max_age_s: ... or when its oldest message has waited this long.
        copy_from: Batches of at least this many rows go through COPY into a temporary table
            (faster), smaller ones through a multi-row INSERT.
        queue: Messages received and not yet written that the collector holds (the source is
            not read beyond it: backpressure goes to the broker).
        queue_bytes: ... and their bytes (payloads, the batch in hand included): the
            collector's memory for messages. One message over it is still taken alone.
        max_bytes: Bytes of values in one SQL statement: a batch over it is written in several
            statements (of one transaction), far below PostgreSQL's 1 GiB message limit.
    """

    max_rows: Annotated[int, Meta(ge=1, le=100_000)] = 2000
    max_age_s: Annotated[float, Meta(ge=0.001, le=60)] = 0.2
    copy_from: Annotated[int, Meta(ge=1, le=100_000)] = 50
    queue: Annotated[int, Meta(ge=1, le=1_000_000)] = 20_000
    queue_bytes: Annotated[int, Meta(ge=4096, le=64 * 2**30)] = 256 * 2**20
    max_bytes: Annotated[int, Meta(ge=4096, le=512 * 2**20)] = 32 * 2**20


class CollectMetricsConfig(ConfigStruct, frozen=True):
    """The collector's Prometheus endpoint (lag, rows/s, batches, duplicates, redeliveries)."""

    host: Host = "127.0.0.1"
    port: Port = 9109


class CollectConfig(ConfigStruct, frozen=True):
    """``collect.yaml``.

    Attributes:
        database: Where rows go.
        source: Where messages come from: ``{type: mqtt, ...}`` or ``{type: nats, ...}``.
        batch: Transaction sizes.
        metrics: The Prometheus endpoint (``None``: none).
        logging_level: ``debug``, ``info``, ``warning`` or ``error``.
    """

    database: DatabaseConfig
    source: MqttSourceConfig | NatsSourceConfig
    batch: BatchConfig = msgspec.field(default_factory=BatchConfig)
    metrics: CollectMetricsConfig | None = None
    logging_level: Literal["debug", "info", "warning", "error"] = "info"
