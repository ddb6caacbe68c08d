"""``edgeinfer cmd``: send one command to a device and print its reply.

    $ edgeinfer cmd pi-kitchen set '{"score_threshold": 0.7}' --key ops-key --broker mqtt.lan
    {"id": "5f0c...", "ok": true, "result": {"pipeline": "faces", "settings": {...}}}

With ``--key`` the command is signed (``control.signed.make_command``), as the verbs in a
device's ``mqtt.commands.signed`` require. The reply is printed as JSON on stdout; an error reply
exits 1 with its message, no reply within ``--timeout`` exits 1 too.
"""

from __future__ import annotations

import argparse
import json
import queue
import time
import uuid
from typing import Any

from ..errors import ConfigError
from ..mqtt.topics import check_level, is_verb
from ._broker import add_broker_arguments
from .ota_cmds import mqtt_config

__all__ = ["add_cmd_arguments", "cmd_cmd"]


def add_cmd_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Publish COMMAND to <prefix>/DEVICE/cmd/COMMAND and print the reply as JSON "
                     "(exit 1 for an error reply or none). Verbs listed in the device's "
                     "mqtt.commands.signed need --key.")
    p.add_argument("device", help="the device id")
    p.add_argument("command", help="status, pause, resume, reload, snapshot, set or reset")
    p.add_argument("args", nargs="?", help="the arguments as a JSON object, e.g. "
                   "'{\"pipeline\": \"faces\", \"score_threshold\": 0.7}'")
    p.add_argument("--key", help="sign with this private key from `edgeinfer keygen`")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="give up waiting for the reply after S seconds (default: %(default)s)")
    add_broker_arguments(p)


def cmd_cmd(args: argparse.Namespace) -> int:
    """Publish the command, wait for the reply carrying its id, print it."""
    # Inside, not at the top: these import msgspec (the client paho too) at their top, and
    # `edgeinfer --help` imports this module.
    from ..control.commands import CommandError
    from ..mqtt.client import Message, MqttClient

    if not is_verb(args.command):
        raise ConfigError(f"{args.command!r} is not a command verb ([a-z0-9_-], 1 to 32 long)")
    try:
        check_level(args.device, "device")
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    request_id = uuid.uuid4().hex
    payload = _payload(args, _arguments(args.args), request_id)
    config = mqtt_config(args)
    try:
        client = MqttClient(config, "cmd", announce=False)
    except ValueError as exc:  # a --prefix that is no topic level
        raise ConfigError(f"--prefix: {exc}") from exc
    topic = f"{config.prefix}/{args.device}/cmd/{args.command}"
    replies: queue.Queue[Message] = queue.Queue(maxsize=1000)
    client.subscribe(f"{topic}/reply", 1, replies.put)
    client.start()
    try:
        deadline = time.monotonic() + args.timeout
        if not client.wait_connected(args.timeout):
            raise CommandError(f"no connection to {config.host}:{config.resolved_port()} within "
                               f"{args.timeout:g} s ({client.last_error or client.state})")
        client.publish(topic, payload, qos=1)
        reply = _reply(replies, request_id, deadline)
    finally:
        client.stop(timeout_s=1.0)
    if reply is None:
        raise CommandError(f"no reply from {args.device} within {args.timeout:g} s")
    print(json.dumps(reply))
    if not reply.get("ok"):
        raise CommandError(f"{args.device} refused {args.command}: {reply.get('error')}")
    return 0


def _arguments(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"ARGS is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError("ARGS must be a JSON object, e.g. '{\"pipeline\": \"faces\"}'")
    return value


def _payload(args: argparse.Namespace, body: dict[str, Any], request_id: str) -> bytes:
    if not args.key:
        return json.dumps({**body, "id": request_id}).encode()
    from ..control.signed import make_command  # inside: msgspec
    from ..keys import load_private_key  # inside: its base64/hashlib/stat, not for --help

    return make_command(args.device, args.command, body, load_private_key(args.key),
                        request_id=request_id)


def _reply(replies: queue.Queue[Any], request_id: str, deadline: float) -> dict[str, Any] | None:
    """The reply carrying ``request_id`` (others' replies are skipped), or None at the deadline."""
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = replies.get(timeout=left)
        except queue.Empty:
            return None
        try:
            reply = json.loads(message.payload)
        except (ValueError, RecursionError):  # any bytes a client sent
            continue
        if isinstance(reply, dict) and reply.get("id") == request_id:
            return reply
    return None
