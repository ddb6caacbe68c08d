"""Outbox files damaged as a power cut, a bad SD card or a mistake would (shared by the tests of
the outbox file and of the daemon)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from edgeinfer.mqtt.outbox import Outbox


def damage(path: Path, how: str, topic: str = "edgeinfer/dev/a/result") -> None:
    """Fill an outbox with 2000 results on ``topic`` and damage it as a power cut, a bad SD
    card or a mistake would (or put a folder in its place)."""
    if how == "directory":
        path.mkdir()
        (path / "stray").write_text("x")
        return
    with Outbox(path) as ob:
        for seq in range(1, 2001):
            payload = json.dumps({"seq": seq, "pad": os.urandom(90).hex()}).encode()
            ob.put(topic.split("/")[2], seq, topic, payload)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        if how == "header":
            f.write(b"this is no database header!!!!!!")
        elif how == "truncated":
            f.truncate(size // 2 + 100)
        elif how == "page":
            f.seek(4096 * 20)
            f.write(os.urandom(4096))
