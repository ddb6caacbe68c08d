"""The broker a command-line client (``watch``, ``push-model``) connects to: the ``mqtt:``
section of ``-c CONFIG``, else a plain MQTT 3.1.1 connection, with a client id of its own."""

from __future__ import annotations

import argparse
import os
import uuid
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config.mqtt import MqttConfig


def add_broker_arguments(p: argparse.ArgumentParser) -> None:
    """The broker options of a client that sends (``push-model``, ``cmd``); read by
    `edgeinfer.cli.ota_cmds.mqtt_config`."""
    p.add_argument("-c", "--config", help="YAML config whose mqtt: section names the broker")
    p.add_argument("--broker", metavar="HOST[:PORT]", help="broker (default: the config's, or "
                   "127.0.0.1:1883)")
    p.add_argument("--prefix", help="first topic level (default: the config's, or edgeinfer)")
    p.add_argument("--username", help="broker user name")
    p.add_argument("--password", help="broker password (or EDGEINFER_MQTT_PASSWORD)")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca", metavar="FILE", help="CA certificate for TLS")
    p.add_argument("--cert", metavar="FILE", help="client certificate for TLS")
    p.add_argument("--cert-key", metavar="FILE", help="client certificate's key for TLS")


def client_base(config_path: str | None, verb: str, *, instead: str, initial_s: float,
                max_s: float) -> tuple[MqttConfig, dict[str, Any]]:
    """The config to start from and the changes every such client makes to it (its own
    client id, its reconnect pace); ``instead`` names the options to use without a section."""
    # Inside, not at the top, as every config import in this file: they import msgspec at their
    # top, and `edgeinfer --help` imports this module.
    from ..config.mqtt import MqttConfig
    from ..config.pipeline import ReconnectConfig

    if config_path:
        from ..config import load_config

        loaded = load_config(config_path).mqtt
        if loaded is None:
            raise ConfigError(f"{config_path}: no mqtt: section; give {instead} instead")
        config = loaded
    else:
        # 3.1.1 also reaches the embedded broker (amqtt); these clients need nothing of MQTT 5.
        config = MqttConfig(protocol="v3.1.1")
    return config, {
        "client_id": f"edgeinfer-{verb}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
        "reconnect": ReconnectConfig(initial_s=initial_s, max_s=max_s),
    }


def listener_config(args: Any, verb: str, *, initial_s: float, max_s: float) -> MqttConfig:
    """The broker of a listening client (``watch``, ``fleet``): ``-c CONFIG``'s ``mqtt:``
    section or a plain connection, with ``--host``, ``--port`` and ``--prefix`` applied."""
    import msgspec  # inside: as the config imports above

    config, changes = client_base(args.config, verb, instead="--host/--port",
                                  initial_s=initial_s, max_s=max_s)
    if args.host:
        changes["host"] = args.host
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            raise ConfigError(f"--port: {args.port} is not a TCP port (1-65535)")
        changes["port"] = args.port
    if args.prefix:
        changes["prefix"] = args.prefix
    return msgspec.structs.replace(config, **changes)
