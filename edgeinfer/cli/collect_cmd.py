"""``edgeinfer collect -c collect.yaml``: the fleet collector (``docs/fleet.md``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

from .._importer import import_from_string

if TYPE_CHECKING:
    from ..fleet.collector import Source
    from ..config.collect import CollectConfig, MqttSourceConfig, NatsSourceConfig

logger = logging.getLogger("edgeinfer.collect")

# source type -> its class, imported only when chosen (paho or nats-py)
SOURCES = {
    "mqtt": "edgeinfer.fleet.mqtt_source:MqttSource",
    "nats": "edgeinfer.fleet.nats_source:NatsSource",
}


def add_collect_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Read every device's results, events and status from the broker (an MQTT 5 "
                     "shared subscription, or a NATS JetStream durable consumer) and write them "
                     "into PostgreSQL exactly once: acknowledged only after the commit, "
                     "duplicates dropped by key. Run one or more; SIGTERM stops after the batch "
                     "in hand. See docs/fleet.md.")
    p.add_argument("-c", "--config", required=True, help="collect.yaml")
    p.add_argument("--migrate-only", action="store_true",
                   help="apply the database schema migrations and exit")


def cmd_collect(args: argparse.Namespace) -> int:
    # Inside, not at the top, as every config import in this file: they import msgspec at their
    # top (the database psycopg when it connects), and `edgeinfer --help` imports this module.
    from ..config.collect import CollectConfig
    from ..config.loader import load_struct
    from ..fleet.collector import Collector  # its queue, threading and records: not for --help
    from ..fleet.db import Database

    config = load_struct(args.config, CollectConfig)
    if not args.verbose:
        logging.getLogger().setLevel(config.logging_level.upper())
    applied = _migrate(Database(config.database))
    if args.migrate_only:
        print(f"edgeinfer collect: migrations applied: {applied or 'none (up to date)'}")
        return 0
    _check_receive_maximum(config)
    db = Database(config.database, copy_from=config.batch.copy_from,
                  max_bytes=config.batch.max_bytes)
    collector = Collector(config, make_source(config.source), db)
    server = _metrics(collector, config)
    _handle_signals(collector)
    try:
        collector.run()
    finally:
        if server is not None:
            server.stop()
    print("edgeinfer collect: " + json.dumps(_summary(collector.stats())), file=sys.stderr)
    return 0


def make_source(config: MqttSourceConfig | NatsSourceConfig) -> Source:
    """The source the ``source:`` section's ``type`` names."""
    from ..config.collect import MqttSourceConfig  # inside: msgspec

    kind = "mqtt" if isinstance(config, MqttSourceConfig) else "nats"
    source_class: Any = import_from_string(SOURCES[kind])
    source: Source = source_class(config)
    return source


def _migrate(db: Any) -> list[int]:
    db.connect()
    try:
        applied: list[int] = db.migrate()
    finally:
        db.close()
    if applied:
        logger.info("database migrations applied: %s", applied)
    return applied


def _check_receive_maximum(config: CollectConfig) -> None:
    from ..config.collect import MqttSourceConfig  # inside: msgspec

    source, batch = config.source, config.batch
    if not isinstance(source, MqttSourceConfig):
        return
    if source.receive_maximum < 2 * batch.max_rows:
        logger.warning("source.receive_maximum %d is under twice batch.max_rows (%d): batches "
                       "will wait for max_age_s", source.receive_maximum, batch.max_rows)
    if source.receive_maximum > batch.queue:
        logger.warning("source.receive_maximum %d is over batch.queue %d: a full queue blocks "
                       "the MQTT network thread", source.receive_maximum, batch.queue)


def _metrics(collector: Any, config: Any) -> Any:
    from ..fleet.metrics import CollectMetricsServer  # http.server, wsgiref: not for --help

    if config.metrics is None:
        return None
    server = CollectMetricsServer(collector, config.metrics)
    server.start()
    return server


def _handle_signals(collector: Any) -> None:
    """The first SIGTERM/SIGINT stops after the batch in hand; a second one exits at once."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if collector.stopping:
            raise KeyboardInterrupt
        logger.info("%s: stopping after the batch in hand", signal.Signals(signum).name)
        collector.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _summary(stats: dict[str, Any]) -> dict[str, Any]:
    keys = ("received", "rows", "batches", "duplicates", "rejected", "redeliveries",
            "db_failures")
    return {key: stats.get(key) for key in keys}
