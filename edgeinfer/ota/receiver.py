"""A model being received: chunks written at their offsets into a staged file, with a bitmap of
the chunks that arrived, both made durable so that a restarted device resumes the transfer.

    <state_dir>/ota/staging/<transfer>/
        offer.json   the offer as received (manifest text, signature, transfer, golden)
        data.part    the model file, chunk i at i * chunk_size (sparse until written)
        have.bin     one byte per chunk, 1 = written and fsynced; replaced atomically

``flush()`` fsyncs ``data.part`` before it replaces ``have.bin``, so a chunk counts as received
only once its bytes are on disk: after a crash, at worst some chunks are asked for again.

Each chunk is checked on arrival against its sha256 in the signed manifest: a forged or damaged
chunk is dropped (and so still reported missing), never written; the first chunk that matches
is kept.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import OtaRejected
from .._durable import fsync_dir, remove_path, write_atomic

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..keys import PublicKey
    from .manifest import Manifest, Offer

__all__ = ["StagedTransfer"]

logger = logging.getLogger(__name__)

OFFER, DATA, HAVE = "offer.json", "data.part", "have.bin"


class StagedTransfer:
    """One transfer's staging folder; not thread-safe (the agent holds its lock around it).

    Attributes:
        offer: The parsed offer; ``manifest`` its checked manifest.
        group: The fleet group it came through, or None for a push to this device.
        last_chunk: ``time.monotonic()`` of the last chunk (or of the offer).
    """

    def __init__(self, folder: Path, payload: bytes, offer: Offer, manifest: Manifest,
                 group: str | None, have: bytearray) -> None:
        self.folder = folder
        self.payload = payload
        self.offer = offer
        self.manifest = manifest
        self.group = group
        self.chunk_size = manifest.chunk_size  # signed; open_offer checked the transfer's
        self.chunks = len(manifest.chunks)
        self.size = manifest.size
        self._have = have
        self._received = sum(have)
        self._dirty = False
        self._fd: int | None = os.open(folder / DATA, os.O_RDWR)
        self.last_chunk = time.monotonic()
        self.bad_chunks = 0

    # -- opening -----------------------------------------------------------------------------
    @classmethod
    def create(cls, folder: Path, payload: bytes, offer: Offer, manifest: Manifest,
               group: str | None) -> StagedTransfer:
        """Start receiving into ``folder``, or resume what it holds for the same file (same
        sha256 and chunk size); anything else there is discarded."""
        folder.mkdir(parents=True, exist_ok=True)
        have = _resumable(folder, manifest.sha256, manifest.size, manifest.chunk_size,
                          len(manifest.chunks))
        if have is None:
            for child in folder.iterdir():
                remove_path(child)
            write_atomic(folder / DATA, b"")
            os.truncate(folder / DATA, manifest.size)
            have = bytearray(len(manifest.chunks))
            write_atomic(folder / HAVE, bytes(have))
        write_atomic(folder / OFFER, payload)
        fsync_dir(folder)
        return cls(folder, payload, offer, manifest, group, have)

    @classmethod
    def load(cls, folder: Path, trusted: Mapping[str, PublicKey], *,
             allow_unsigned: bool) -> StagedTransfer:
        """Reopen a staged transfer after a restart; its offer is checked again (the trusted
        keys may have changed since).

        Raises:
            OtaRejected: the folder is incomplete or its offer no longer passes.
        """
        from .manifest import open_offer, parse_offer

        try:
            payload = (folder / OFFER).read_bytes()
        except OSError as exc:
            raise OtaRejected("interrupted", f"staged transfer {folder.name} is incomplete: "
                              f"{exc}") from None
        offer = parse_offer(payload)
        manifest = open_offer(offer, trusted, allow_unsigned=allow_unsigned)
        have = _resumable(folder, manifest.sha256, manifest.size, manifest.chunk_size,
                          len(manifest.chunks))
        if have is None:
            raise OtaRejected("interrupted", f"staged transfer {folder.name} is damaged")
        group = None
        marker = folder / "group"
        if marker.exists():
            group = marker.read_text().strip() or None
        return cls(folder, payload, offer, manifest, group, have)

    def remember_group(self) -> None:
        """Keep the group a transfer came through, for its status after a restart."""
        if self.group:
            write_atomic(self.folder / "group", self.group.encode())

    # -- chunks ------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.offer.transfer.id

    @property
    def request(self) -> str:
        """The id of the signed offer this transfer answers (``manifest.request_id``)."""
        from .manifest import request_id

        return request_id(self.offer.manifest, self.offer.signature)

    @property
    def data_path(self) -> Path:
        return self.folder / DATA

    @property
    def received(self) -> int:
        return self._received

    @property
    def complete(self) -> bool:
        return self._received == self.chunks

    def expected_length(self, index: int) -> int:
        return min(self.chunk_size, self.size - index * self.chunk_size)

    def write(self, index: int, data: bytes) -> bool:
        """Write chunk ``index``; True if it was new. A duplicate is accepted and ignored.

        Raises:
            OtaRejected: ``bad_transfer``: the index is out of range, the length is wrong or
                the bytes are not the signed chunk's (the chunk is dropped, so it stays
                missing; the transfer goes on).
        """
        if not 0 <= index < self.chunks:
            self.bad_chunks += 1
            raise OtaRejected("bad_transfer", f"chunk {index} out of range 0-{self.chunks - 1}")
        if len(data) != self.expected_length(index):
            self.bad_chunks += 1
            raise OtaRejected("bad_transfer", f"chunk {index} has {len(data)} bytes, "
                              f"expected {self.expected_length(index)}")
        if self._have[index]:
            self.last_chunk = time.monotonic()
            return False
        if hashlib.sha256(data).hexdigest() != self.manifest.chunks[index]:
            self.bad_chunks += 1
            raise OtaRejected("bad_transfer", f"chunk {index} is not the signed chunk (sha256 "
                                              "differs); dropped, asked for again")
        self.last_chunk = time.monotonic()
        assert self._fd is not None
        os.pwrite(self._fd, data, index * self.chunk_size)
        self._have[index] = 1
        self._received += 1
        self._dirty = True
        return True

    def missing(self) -> list[int]:
        return [i for i, got in enumerate(self._have) if not got]

    def flush(self) -> None:
        """Make the chunks written so far durable (data first, then the bitmap)."""
        if not self._dirty or self._fd is None:
            return
        os.fsync(self._fd)
        write_atomic(self.folder / HAVE, bytes(self._have))
        self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.flush()
            finally:
                os.close(self._fd)
                self._fd = None

    def remove(self) -> None:
        """Close and delete the staging folder."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        shutil.rmtree(self.folder, ignore_errors=True)


def _resumable(folder: Path, sha256: str, size: int, chunk_size: int,
               chunks: int) -> bytearray | None:
    """The bitmap of a staged transfer of the same file in ``folder``, or None."""
    from .manifest import parse_offer

    try:
        old = parse_offer((folder / OFFER).read_bytes())
        have = bytearray((folder / HAVE).read_bytes())
        data_size = (folder / DATA).stat().st_size
    except (OSError, OtaRejected):
        return None
    try:
        old_manifest = json.loads(old.manifest)
    except ValueError:
        return None
    if (old_manifest.get("sha256") != sha256 or old.transfer.chunk_size != chunk_size
            or len(have) != chunks or data_size != size or any(b > 1 for b in have)):
        return None
    return have
