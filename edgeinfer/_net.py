"""Loopback networking helpers shared by the demo and the test harnesses."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, below the kernel's ephemeral range where possible.

    A client retrying a loopback port of the ephemeral range while its broker is down can be
    given that very port as its source and connect to itself (TCP simultaneous open), which
    then keeps the broker from starting there.
    """
    low = _ephemeral_low()
    for _ in range(50):
        port = random.randrange(10000, low) if low > 10100 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
