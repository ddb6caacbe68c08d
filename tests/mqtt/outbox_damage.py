"""Outbox files damaged as a power cut, a bad SD card or a mistake would, and a full file
system (shared by the tests of the outbox file and of the daemon)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

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


@contextmanager
def full_tmpfs(mount: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at ``mount`` and filled up (the test is skipped where mounting is
    not allowed: it needs root)."""
    mount.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
