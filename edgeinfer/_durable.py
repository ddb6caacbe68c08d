"""Durable file operations (the OTA store, staging and keys, command nonces, analytics
counters): a file holds its new content or its old one, never a mix, even across a power cut
(write a temporary file, fsync it, rename it over the target, fsync the folder)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["fsync_dir", "remove_path", "write_atomic", "write_new"]


def fsync_dir(folder: Path) -> None:
    """Make the folder's entries (a rename, a new or removed file) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` (file mode ``mode``) through ``<path>.tmp``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # O_CREAT's mode is masked by umask, and tmp may be old
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` exclusively (``FileExistsError`` if it exists) with ``mode``; a failed
    write leaves no file behind."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    finally:
        fsync_dir(path.parent)


def remove_path(path: Path) -> None:
    """Remove a file, a link or a whole folder; what is already gone is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
