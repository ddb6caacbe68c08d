"""Single-use nonces that survive a restart, for signed requests that must act once: signed
commands (``control.signed``) and OTA rollback requests (``ota.replay``).

A nonce is kept until the request it came with would be refused as too old anyway, then
forgotten; the book is written through (atomically, fsynced) before the request acts, so a
replay after a crash or restart is refused too. The file is ``{nonce: expiry unix time}``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

__all__ = ["NonceBook", "NonceRefused"]

logger = logging.getLogger(__name__)


class NonceRefused(Exception):
    """A nonce not taken: ``reason`` is ``replayed`` (seen before) or ``full`` (the book holds
    ``max_nonces`` unexpired ones). Callers turn it into their own error."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NonceBook:
    """Nonces taken, each until its expiry, kept in ``path``.

    Args:
        path: The JSON file (its folder is created on the first write).
        max_nonces: At most this many unexpired nonces; past it new ones are refused until some
            expire (an old nonce is never forgotten early: that would allow its replay).
    """

    def __init__(self, path: Path, *, max_nonces: int = 10_000) -> None:
        self.path = Path(path)
        self.max_nonces = max_nonces
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}
        try:
            raw = json.loads(self.path.read_bytes())
            self._seen = {str(k): float(v) for k, v in dict(raw).items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            # Refusing every request would lock the operators out; starting empty reopens
            # replays only of requests still within their age limit. Say so loudly.
            logger.error("cannot read the nonces taken in %s (%s); starting afresh",
                         self.path, exc)

    def take(self, nonce: str, expires: float, *, now: float | None = None) -> None:
        """Take ``nonce`` (durably, before this returns), remembered until ``expires``.

        Raises:
            NonceRefused: seen before, or the book is full.
        """
        from ._durable import write_atomic

        now = time.time() if now is None else now
        with self._lock:
            seen = {k: v for k, v in self._seen.items() if v > now}
            if nonce in seen:
                raise NonceRefused("replayed", f"nonce {nonce} was already used")
            if len(seen) >= self.max_nonces:
                raise NonceRefused("full", f"{len(seen)} signed requests within their age "
                                           "limit: refused until some expire")
            seen[nonce] = expires
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(seen).encode(), 0o600)
            self._seen = seen

    def __contains__(self, nonce: object) -> bool:
        return nonce in self._seen
