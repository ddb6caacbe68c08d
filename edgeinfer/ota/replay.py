"""What a device remembers against replayed updates, across restarts (``docs/ota.md``):

    <state_dir>/ota/replay.json
        {"sequences": {"<pipeline>": <highest sequence installed>},
         "downgrades": {"<request id>": <its expires time>}}
    <state_dir>/ota/rollback-nonces.json      (an ``edgeinfer.nonces.NonceBook``)
        {"<rollback nonce>": <when its request is too old anyway>}

A manifest must carry a sequence above the pipeline's highest installed one, unless it is
signed as a deliberate ``downgrade`` (and that one request is then taken only once). A rollback
nonce is taken once; nonces are forgotten once their requests are too old to be accepted
anyway. Written with ``write_atomic`` (a power cut leaves the old or the new file).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import msgspec

from ..errors import OtaRejected
from ..nonces import NonceBook, NonceRefused
from .._durable import write_atomic

__all__ = ["ReplayGuard"]

logger = logging.getLogger(__name__)

FILE = "replay.json"
NONCES_FILE = "rollback-nonces.json"


class _State(msgspec.Struct, kw_only=True):
    sequences: dict[str, int] = {}
    downgrades: dict[str, float] = {}


class ReplayGuard:
    """The highest installed sequence per pipeline and the requests already taken.

    Args:
        folder: ``<state_dir>/ota`` (created).
        nonce_ttl_s: how long a rollback nonce is kept (the requests' maximum age plus skew).
    """

    def __init__(self, folder: Path, *, nonce_ttl_s: float = 900 + 120) -> None:
        self.path = Path(folder) / FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.nonce_ttl_s = nonce_ttl_s
        self.nonces = NonceBook(self.path.parent / NONCES_FILE, max_nonces=100_000)
        self._lock = threading.Lock()
        self._state = self._load()

    def _load(self) -> _State:
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=_State)
        except FileNotFoundError:
            return _State()
        except (OSError, msgspec.DecodeError) as exc:  # ValidationError is a DecodeError
            # Refusing every update would brick the device's updates; starting empty reopens
            # replays of old signed manifests (still bounded by their expiry). Say so loudly.
            logger.error("ota: %s is unreadable (%s); replay protection starts afresh",
                         self.path, exc)
            return _State()

    def _save(self) -> None:
        write_atomic(self.path, msgspec.json.encode(self._state))

    def highest(self, pipeline: str) -> int | None:
        with self._lock:
            return self._state.sequences.get(pipeline)

    def check_sequence(self, pipeline: str, sequence: int, *, downgrade: bool, request: str,
                       running: bool = False) -> None:
        """Refuse a manifest whose sequence is not above the highest installed one.

        Args:
            pipeline: the manifest's pipeline.
            sequence: its sequence.
            downgrade: it is signed as a deliberate downgrade (taken once: its request id is
                remembered by ``accept``).
            request: its request id.
            running: its model is the one the pipeline runs (an offer answered ``committed``
                without a transfer): the highest sequence itself is fine then.

        Raises:
            OtaRejected: ``downgrade`` (or ``replayed`` for a downgrade already taken).
        """
        with self._lock:
            top = self._state.sequences.get(pipeline)
            if downgrade:
                if request in self._state.downgrades:
                    raise OtaRejected("replayed", f"downgrade {request} was already installed "
                                                  "once; sign a new one")
                return
            if top is None or sequence > top or (running and sequence == top):
                return
        raise OtaRejected("downgrade", f"sequence {sequence} is not above {top}, the highest "
                                       f"installed on pipeline {pipeline} (a replayed or older "
                                       "manifest; sign it with downgrade to go back)")

    def accept(self, pipeline: str, sequence: int, *, downgrade: bool, request: str,
               expires: float) -> None:
        """Record an installed update (durably, before this returns)."""
        with self._lock:
            seqs = self._state.sequences
            seqs[pipeline] = max(sequence, seqs.get(pipeline, sequence))
            if downgrade:
                now = time.time()
                self._state.downgrades = {k: v for k, v in self._state.downgrades.items()
                                          if v >= now}
                self._state.downgrades[request] = expires
            self._save()

    def use_nonce(self, nonce: str, created: float) -> None:
        """Take a rollback request's nonce once (durably, before this returns).

        Raises:
            OtaRejected: ``replayed``.
        """
        try:
            self.nonces.take(nonce, created + self.nonce_ttl_s)
        except NonceRefused as exc:
            reason = "replayed" if exc.reason == "replayed" else "busy"
            raise OtaRejected(reason, f"rollback request refused: {exc}") from None
