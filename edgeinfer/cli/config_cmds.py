"""``edgeinfer validate-config``."""

from __future__ import annotations

import argparse
import sys

from ..daemon.sandbox import socket_bind_dropin


def add_validate_arguments(p: argparse.ArgumentParser) -> None:
    p.description = "Parse and validate CONFIG; errors name the path and line."
    p.add_argument("config", help="YAML config file")
    p.add_argument("--json", action="store_true", help="print the resolved config as JSON")
    p.add_argument("--strict", action="store_true",
                   help="also fail (exit 78) when the config cannot start here: a missing model "
                   "or key file, no pipelines (without it these are warnings)")
    p.add_argument("--kind", choices=("auto", "device", "collect"), default="auto",
                   help="which config: a device's (edgeinfer run) or a collector's (edgeinfer "
                   "collect); auto: a collector's when its top level has database: or source: "
                   "and no device key (default)")
    p.add_argument("--systemd-dropin", action="store_true",
                   help="print a systemd drop-in that lets the service bind exactly the ports "
                   "this config listens on (web view, metrics, embedded broker) and no other")


def cmd_validate(args: argparse.Namespace) -> int:
    """Exit 0 for a valid config; with ``--strict``, 78 also when it cannot start here.

    What it checks is what ``edgeinfer run`` checks before it loads a model or opens a device
    (`edgeinfer.daemon.startable.start_problems`, which both call).

    A config is usually written on one machine and run on another: the model files and keys it
    names may exist only on the device. So by default what keeps it from starting *here* is
    printed as a warning (on stderr, never "OK"); ``--strict`` (on the device, before
    ``systemctl restart``) makes it an error, as ``edgeinfer run`` does.
    """
    # Inside, not at the top: msgspec and our config modules (they import it at their top) stay
    # out of `edgeinfer --help`, which imports this module (tests/test_cli.py checks).
    import msgspec

    from ..config import load_config
    from ..config.loader import config_kind
    from ..daemon.startable import start_problems

    if getattr(args, "systemd_dropin", False):
        # The ports need no secrets: credentials the service alone can read are stood in for.
        sys.stdout.write(socket_bind_dropin(load_config(args.config, stand_in_credentials=True),
                                            args.config))
        return 0
    kind = getattr(args, "kind", "auto")
    if kind == "collect" or (kind == "auto" and config_kind(args.config) == "collect"):
        return _validate_collect(args)
    config = load_config(args.config)
    # The check `edgeinfer run` makes before it opens anything (and the daemon before it
    # starts a pipeline): one function, so the two never disagree.
    problems = start_problems(config)
    invalid = [p for p in problems if p.invalid]
    if invalid:  # as invalid as a YAML error: no machine fixes it
        for problem in invalid:
            print(f"{args.config}: {problem}", file=sys.stderr)
        return 78
    if args.json:
        data = msgspec.to_builtins(config)
        if data.get("mqtt") and data["mqtt"].get("password"):
            data["mqtt"]["password"] = "<redacted>"  # never print a secret
        if data.get("http") and data["http"].get("token"):
            data["http"]["token"] = "<redacted>"
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(data)).decode() + "\n")
    if problems:
        fatal = any(p.fatal for p in problems)
        waits = all(p.waits for p in problems)  # only devices not plugged in here
        head = ("cannot start here" if fatal else "some devices it reads are missing here"
                if waits else "some pipelines cannot start here")
        label = "error" if args.strict else "warning"
        print(f"{args.config}: valid, but {head}:", file=sys.stderr)
        for p in problems:
            print(f"  {label}: {p}", file=sys.stderr)
        if args.strict:
            return 78
        if not args.json:
            print(f"{args.config}: valid (" + ("devices missing here" if waits else
                                                "not startable here")
                  + "; `--strict` fails on this)")
        return 0
    if not args.json:
        names = ", ".join(p.name for p in config.pipelines) or "none"
        print(f"{args.config}: OK (device {config.resolved_device_id()}, "
              f"{len(config.pipelines)} pipeline(s): {names})")
    return 0


def _validate_collect(args: argparse.Namespace) -> int:
    """A collector's ``collect.yaml`` (``edgeinfer collect -c``)."""
    import msgspec  # inside, with our config modules: as in cmd_validate

    from ..config.collect import CollectConfig, MqttSourceConfig
    from ..config.loader import load_struct

    config = load_struct(args.config, CollectConfig)
    if args.json:
        data = msgspec.to_builtins(config)
        for section in ("database", "source"):
            for key in ("password", "token"):
                if data[section].get(key):
                    data[section][key] = "<redacted>"  # never print a secret
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(data)).decode() + "\n")
        return 0
    source = config.source
    if isinstance(source, MqttSourceConfig):
        where = f"mqtt {source.host}:{source.port or (8883 if source.tls else 1883)}"
    else:
        where = f"nats {', '.join(source.servers)}"
    print(f"{args.config}: OK (collector: {where}, prefix {source.prefix}, "
          f"schema {config.database.schema})")
    return 0
