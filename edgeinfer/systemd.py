"""The sd_notify protocol without libsystemd: ``KEY=VALUE`` lines in one datagram to
``$NOTIFY_SOCKET``, and the watchdog interval from ``$WATCHDOG_USEC``.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a no-op returning ``False``, so the daemon
calls these unconditionally::

    systemd.ready("2 pipelines, 14.8 fps, outbox 0")
    systemd.watchdog()            # every watchdog_interval() / 2 while healthy
    systemd.reloading(); ...; systemd.ready(status)
    systemd.stopping()
"""

from __future__ import annotations

import logging
import os
import socket
import time

logger = logging.getLogger(__name__)


def notify(**fields: object) -> bool:
    """Send ``KEY=VALUE`` lines (keys as given, e.g. ``READY=1``) to the service manager.

    Returns:
        ``True`` if the datagram was sent; ``False`` without ``$NOTIFY_SOCKET`` or on a socket
        error (a notification is never worth failing the daemon for).
    """
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not fields:
        return False
    if address.startswith("@"):  # abstract namespace
        address = "\0" + address[1:]
    payload = "".join(f"{key}={value}\n" for key, value in fields.items()).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(payload, address)
    except OSError as exc:
        logger.debug("sd_notify to %s failed: %s", address, exc)
        return False
    return True


def ready(status: str | None = None) -> bool:
    """``READY=1``, with ``STATUS=`` when given."""
    return notify(READY=1, **_status(status))


def status(text: str) -> bool:
    """``STATUS=text``: one line, what ``systemctl status`` shows."""
    return notify(STATUS=_one_line(text))


def stopping(status: str | None = None) -> bool:
    """``STOPPING=1``."""
    return notify(STOPPING=1, **_status(status))


def reloading() -> bool:
    """``RELOADING=1`` with ``MONOTONIC_USEC`` (``Type=notify-reload`` requires it); send
    :func:`ready` when the reload is over."""
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify(RELOADING=1, MONOTONIC_USEC=usec)


def watchdog() -> bool:
    """``WATCHDOG=1``: the service is alive."""
    return notify(WATCHDOG=1)


def watchdog_interval() -> float | None:
    """Seconds from ``$WATCHDOG_USEC`` (``None`` when unset, invalid or, with
    ``$WATCHDOG_PID``, meant for another process). Ping at half of it."""
    pid = os.environ.get("WATCHDOG_PID")
    if pid is not None and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(os.environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None


def _status(text: str | None) -> dict[str, str]:
    return {} if text is None else {"STATUS": _one_line(text)}


def _one_line(text: str) -> str:
    return " ".join(text.split())
