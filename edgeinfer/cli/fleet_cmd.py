"""``edgeinfer fleet``: list the devices on a broker from their retained status and their stats.

Subscribes to ``<prefix>/+/status`` (retained: every device that ever announced itself answers
at once) and ``<prefix>/+/stats`` (every ``stats_interval_s``: fps and the outbox) for ``--wait``
seconds, then prints a table, or with ``--json`` one document::

    DEVICE  STATE   VERSION  PIPELINE  BACKEND         MODEL        FPS   OUTBOX  LAST SEEN  FAILED
    cam1    online  0.1.0    faces     cpu fp32 1t     blazeface 1  29.8  0       1 s ago    -
    cam2    offline 0.1.0    -         -               -            -     -       3 h ago    -
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import time
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..fleet.listing import MAX_DEVICES, Fleet, render_table
from ._broker import listener_config

if TYPE_CHECKING:
    from ..config.mqtt import MqttConfig
    from ..mqtt.client import Message

__all__ = ["add_fleet_arguments", "cmd_fleet"]

EXIT_UNREACHABLE = 69  # EX_UNAVAILABLE


def add_fleet_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("List the devices that published a retained status under the prefix: "
                     "online or not, pipelines, backends, model versions, fps, outbox depth, "
                     "when last seen.")
    p.add_argument("-c", "--config", help="YAML config whose mqtt: section names the broker")
    p.add_argument("--prefix", help="first topic level (default: the config's, or edgeinfer)")
    p.add_argument("--host", help="broker host (default: the config's, or 127.0.0.1)")
    p.add_argument("--port", type=int, help="broker port (default: the config's, or 1883)")
    p.add_argument("--wait", type=float, default=2.0, metavar="S",
                   help="how long to gather retained status and stats (default: %(default)s s)")
    p.add_argument("--max-devices", type=int, default=MAX_DEVICES, metavar="N",
                   help="devices kept; past it the ones seen least recently are dropped and "
                        "counted (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON document")


def cmd_fleet(args: argparse.Namespace) -> int:
    """Gather for ``--wait`` seconds, print the devices; exit 69 when the broker is unreachable."""
    from ..mqtt.client import MqttClient  # inside: msgspec and paho, not for `edgeinfer --help`

    if not 0 < args.wait <= 3600:
        raise ConfigError(f"--wait: {args.wait} is not between 0 and 3600 seconds")
    if not 1 <= args.max_devices <= 1_000_000:
        raise ConfigError(f"--max-devices: {args.max_devices} is not between 1 and 1000000")
    config = _config(args)
    try:
        client = MqttClient(config, "fleet", announce=False)
    except ValueError as exc:  # a --prefix that is no topic level
        raise ConfigError(f"--prefix: {exc}") from exc
    inbox: queue.Queue[Message] = queue.Queue(maxsize=100_000)
    for kind in ("stats", "status"):
        client.subscribe(f"{config.prefix}/+/{kind}", 1, inbox.put)
    fleet = Fleet(config.prefix, args.max_devices)
    client.start()
    try:
        if not client.wait_connected(args.wait):
            print(f"edgeinfer: error: broker {config.host}:{config.resolved_port()} not "
                  f"reached in {args.wait:g} s: {client.last_error or client.state}",
                  file=sys.stderr)
            return EXIT_UNREACHABLE
        deadline = time.monotonic() + args.wait
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = inbox.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            fleet.add(msg.topic, msg.payload, retained=msg.retain)
    finally:
        client.stop(timeout_s=1.0)
    devices = fleet.devices()
    broker = f"{config.host}:{config.resolved_port()}"
    if args.json:
        print(json.dumps({"broker": broker, "prefix": config.prefix, "ts": round(time.time(), 3),
                          "devices": [d.to_dict() for d in devices],
                          "ignored": fleet.ignored, "dropped": fleet.dropped}, indent=2))
    elif devices:
        print(f"edgeinfer fleet: broker {broker}, prefix {config.prefix}/, {len(devices)} "
              f"device(s)", file=sys.stderr)
        print(render_table(devices))
    if fleet.dropped and not args.json:
        print(f"edgeinfer fleet: {fleet.dropped} device(s) over --max-devices "
              f"{args.max_devices} dropped, the ones seen least recently", file=sys.stderr)
    else:
        print(f"edgeinfer fleet: no device status under {config.prefix}/ on the broker "
              f"{broker} (another broker: --host/--port or -c config.yaml)", file=sys.stderr)
    return 0


def _config(args: argparse.Namespace) -> MqttConfig:
    return listener_config(args, "fleet", initial_s=0.2, max_s=1.0)
