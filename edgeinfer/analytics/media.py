"""Event media on disk: atomic writes, a free-space floor and retention (``record.retention``).

Retention deletes files older than ``max_age_h`` and then the oldest files until the folder
holds at most ``max_mb``. It only looks at regular files inside the media folder (symbolic
links are neither followed nor deleted) and only deletes snapshots and clips (``*.jpg``,
``*.mp4``, ``*.avi``), including this module's own temporary files.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ..config.analytics import RetentionConfig

__all__ = ["MEDIA_SUFFIXES", "MediaStore", "TEMP_PREFIX"]

logger = logging.getLogger(__name__)

MEDIA_SUFFIXES = frozenset({".jpg", ".mp4", ".webm", ".avi"})
TEMP_PREFIX = ".tmp-"
_MIB = 1024 * 1024
_WARN_EVERY_S = 60.0
_MAX_DEPTH = 4
# Errors that pass: a process out of file descriptors (a flood of web clients), the system out
# of them, memory or buffers for a moment. Others (read-only, permissions) do not.
_TRANSIENT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN,
                        errno.EINTR})


class MediaStore:
    """The media folder of one pipeline: ``snapshots/`` and ``clips/`` under ``directory``.

    Thread-safe; the recorder's writer thread writes and enforces retention, ``stats`` may be
    read from any thread.

    Args:
        directory: The pipeline's media folder (made when missing).
        retention: The limits.
    """

    def __init__(self, directory: Path, retention: RetentionConfig) -> None:
        self.directory = Path(directory)
        self.retention = retention
        self.snapshots = self.directory / "snapshots"
        self.clips = self.directory / "clips"
        self.deleted = 0
        self.skipped = 0
        self.errors = 0
        self.retries = 0
        self.bytes_on_disk = 0
        self._lock = threading.Lock()
        self._warned_at: float | None = None

    def prepare(self) -> None:
        """Make the folders and apply retention to what an earlier run left."""
        self.snapshots.mkdir(parents=True, exist_ok=True)
        self.clips.mkdir(parents=True, exist_ok=True)
        self.enforce()

    def has_room(self) -> bool:
        """Whether the filesystem has at least ``min_free_mb`` free; a ``False`` counts a skipped
        write and warns at most once a minute."""
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            free = 0
        if free >= self.retention.min_free_mb * _MIB:
            return True
        with self._lock:
            self.skipped += 1
            now = time.monotonic()
            if self._warned_at is None or now - self._warned_at >= _WARN_EVERY_S:
                self._warned_at = now
                logger.warning("event media not written: %s has %.0f MiB free, below "
                               "min_free_mb %.0f (%d writes skipped so far)", self.directory,
                               free / _MIB, self.retention.min_free_mb, self.skipped)
        return False

    @contextlib.contextmanager
    def atomic(self, final: Path) -> Iterator[Path]:
        """A temporary path next to ``final`` (same suffix) for the caller to write; renamed to
        ``final`` when the block ends without error, removed otherwise. Retention runs after."""
        temp = final.with_name(f"{TEMP_PREFIX}{final.name}")
        try:
            yield temp
            os.replace(temp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                temp.unlink()
            raise
        self.enforce()

    def write_bytes(self, final: Path, data: bytes) -> bool:
        """Write ``data`` to ``final`` atomically; ``False`` when skipped for low disk or failed
        (logged, counted in ``errors``)."""
        return self.save(final, data) is None

    def save(self, final: Path, data: bytes, *, tries: int = 1, delay_s: float = 0.05,
             ) -> str | None:
        """Write ``data`` to ``final`` atomically, trying up to ``tries`` times while the error
        is one that passes (``EMFILE``, ``ENFILE``, ``ENOMEM``, ...), the delay doubling from
        ``delay_s``; returns ``None`` once written, else why not (logged, counted in
        ``errors``; a retry counts in ``retries``)."""
        if not self.has_room():
            return (f"the disk had less than retention.min_free_mb "
                    f"({self.retention.min_free_mb:g} MiB) free")
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.atomic(final) as temp:
                    temp.write_bytes(data)
                return None
            except OSError as exc:
                if exc.errno in _TRANSIENT and attempt < tries:
                    self.retried()
                    time.sleep(delay_s * 2 ** (attempt - 1))
                    continue
                with self._lock:
                    self.errors += 1
                name = errno.errorcode.get(exc.errno or 0, "error")
                logger.warning("cannot write %s: %s (%d tries)", final, exc, attempt)
                return f"cannot write {final.name}: {exc.strerror or exc} ({name}, {attempt} tries)"

    def retried(self) -> None:
        """Count one more write tried again (a clip's, written by its own code)."""
        with self._lock:
            self.retries += 1

    def enforce(self) -> None:
        """Delete files past ``max_age_h``, then the oldest until the total fits ``max_mb``."""
        with self._lock:
            files = sorted(self._scan(self.directory, 0))  # (mtime, size, path), oldest first
            limit_age = self.retention.max_age_h
            cutoff = time.time() - limit_age * 3600 if limit_age is not None else None
            total = sum(size for _, size, _ in files)
            budget = self.retention.max_mb * _MIB
            for mtime, size, path in files:
                if not ((cutoff is not None and mtime < cutoff) or total > budget):
                    break  # sorted by age: nothing younger is past the age limit either
                if self._delete(path):
                    total -= size
            self.bytes_on_disk = total

    def _delete(self, path: str) -> bool:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            logger.warning("retention cannot delete %s: %s", path, exc)
            return False
        self.deleted += 1
        return True

    def _scan(self, folder: Path | str, depth: int) -> Iterator[tuple[float, int, str]]:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth < _MAX_DEPTH:
                        yield from self._scan(entry.path, depth + 1)
                elif (entry.is_file(follow_symlinks=False)
                      and os.path.splitext(entry.name)[1].lower() in MEDIA_SUFFIXES):
                    st = entry.stat(follow_symlinks=False)
                    yield st.st_mtime, st.st_size, entry.path
            except OSError:
                continue
