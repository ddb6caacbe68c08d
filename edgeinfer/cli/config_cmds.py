"""``edgeinfer validate-config``."""

from __future__ import annotations

import argparse
import sys

import msgspec

from ..config import load_config


def cmd_validate(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if args.json:
        data = msgspec.to_builtins(config)
        if data.get("mqtt") and data["mqtt"].get("password"):
            data["mqtt"]["password"] = "<redacted>"  # never print a secret
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(data)).decode() + "\n")
        return 0
    names = ", ".join(p.name for p in config.pipelines) or "none"
    print(f"{args.config}: OK (device {config.resolved_device_id()}, "
          f"{len(config.pipelines)} pipeline(s): {names})")
    return 0
