"""The content-addressed model store and each pipeline's ``current``/``previous`` links.

Layout under ``<state_dir>/ota`` (``docs/ota.md``)::

    objects/<name>/<sha256>.<onnx|tflite>      the model, read-only
    objects/<name>/<sha256>.manifest.json      its manifest (and .sig)
    pipelines/<pipeline>/current  -> ../../objects/<name>/<sha256>.<ext>
    pipelines/<pipeline>/previous -> ../../objects/<name>/<sha256>.<ext>
    pipelines/<pipeline>/pending.json          an applied, not yet committed update
    staging/<transfer>/                        chunks being received

Every file is written to ``<name>.tmp``, fsynced, renamed and its folder fsynced; a link is
switched by renaming a new relative symlink over it. ``pending.json`` is written before any link
moves and removed only at the commit, so after a crash at any point ``recover`` puts the links
back where they were before the update.
"""

# Over 450 lines: one crash-safe state on disk; each link transition reads best beside its undo.

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..errors import OtaRejected
from .._durable import fsync_dir, remove_path, write_atomic
from .manifest import decode_manifest

__all__ = ["ModelStore", "StoreEntry"]

logger = logging.getLogger(__name__)

_PIPELINE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TRANSFER = re.compile(r"[A-Za-z0-9_-]{1,64}")
_MODEL_EXTS = (".onnx", ".tflite")
_LINKS = ("current", "previous")
_PENDING = "pending.json"
_MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """One model object of the store.

    Attributes:
        path: the model file, ``<root>/objects/<name>/<sha256>.<ext>``.
        name: the model name (its folder).
        sha256: of the model file.
        manifest: its manifest as a dict, or None when the manifest file is missing or unreadable.
    """

    path: Path
    name: str
    sha256: str
    manifest: dict[str, Any] | None


# -- durable file operations -------------------------------------------------------------------
def _switch_link(link: Path, target: Path | None) -> None:
    """Point ``link`` at ``target`` with a relative symlink renamed over it (None: remove it)."""
    if target is None:
        if os.path.lexists(link):
            os.unlink(link)
            fsync_dir(link.parent)
        return
    rel = os.path.relpath(target, link.parent)
    tmp = link.with_name(link.name + ".tmp")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(rel, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


class ModelStore:
    """Models pushed over the air and which one each pipeline runs.

    Args:
        root: the store's folder, ``<state_dir>/ota`` (created with its sub-folders).
        keep: objects kept per model name besides those a link or ``pending.json`` references.
    """

    def __init__(self, root: Path, *, keep: int = 3) -> None:
        if keep < 0:
            raise ValueError(f"keep must be >= 0, got {keep}")
        self.root = Path(root).absolute()
        self.keep = keep
        self.objects = self.root / "objects"
        self.pipelines = self.root / "pipelines"
        self.staging = self.root / "staging"
        for folder in (self.objects, self.pipelines, self.staging):
            folder.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"ModelStore({str(self.root)!r}, keep={self.keep})"

    # -- objects ---------------------------------------------------------------------------
    def add(self, src: Path, manifest_text: bytes, signature: str | None) -> StoreEntry:
        """Copy a verified model into the store under its manifest's name and sha256.

        Idempotent: an object already there with the manifest's size is kept (and touched, so
        pruning counts it as new). Its manifest (and signature) go next to it first, so a model
        in the store always has its manifest.

        Args:
            src: the complete model file (the staged file).
            manifest_text: the manifest's exact JSON bytes, as signed.
            signature: the base64 signature, or None for an unsigned update.

        Raises:
            OtaRejected: ``bad_manifest``/``bad_name`` for a bad manifest; ``size_mismatch`` or
                ``sha256_mismatch`` when ``src`` is not the model the manifest describes.
            OSError: the copy failed (disk full...); nothing partial is left under its name.
        """
        m = decode_manifest(manifest_text)
        folder = self.objects / m.name
        folder.mkdir(parents=True, exist_ok=True)
        dest = folder / f"{m.sha256}.{m.format}"
        try:
            present = dest.stat().st_size == m.size
        except FileNotFoundError:
            present = False
        tmp = None if present else self._copy_checked(src, dest, m.size, m.sha256)
        try:
            self._write_meta(folder, m.sha256, manifest_text, signature)
            if tmp is not None:
                os.replace(tmp, dest)
                fsync_dir(folder)
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        if present:
            os.utime(dest)
        logger.info("store: %s %s (%d bytes) at %s", "kept" if present else "added",
                    m.name, m.size, dest)
        return self._entry(dest)

    @staticmethod
    def _write_meta(folder: Path, sha256: str, manifest_text: bytes, signature: str | None) -> None:
        meta = folder / f"{sha256}.manifest.json"
        if not meta.exists() or meta.read_bytes() != manifest_text:
            write_atomic(meta, manifest_text)
        sig = folder / f"{sha256}.sig"
        if signature is not None and (not sig.exists() or sig.read_bytes() != signature.encode()):
            write_atomic(sig, signature.encode("ascii"))

    @staticmethod
    def _copy_checked(src: Path, dest: Path, size: int, sha256: str) -> Path:
        """Copy ``src`` to ``<dest>.tmp`` (read-only, fsynced) and check it is the model the
        manifest describes; returns the temporary file, for the caller to rename."""
        tmp = dest.with_name(dest.name + ".tmp")
        h = hashlib.sha256()
        copied = 0
        try:
            if os.path.lexists(tmp):
                tmp.unlink()
            with open(src, "rb") as fin, open(tmp, "wb") as fout:
                while block := fin.read(_MiB):
                    h.update(block)
                    fout.write(block)
                    copied += len(block)
                fout.flush()
                os.fchmod(fout.fileno(), 0o444)
                os.fsync(fout.fileno())
            if copied != size:
                raise OtaRejected("size_mismatch", f"{src} is {copied} bytes, the manifest says {size}")
            if h.hexdigest() != sha256:
                raise OtaRejected("sha256_mismatch", f"{src} has sha256 {h.hexdigest()}, the "
                                                     f"manifest says {sha256}")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def _entry(self, path: Path) -> StoreEntry:
        sha = path.name.split(".", 1)[0]
        manifest: dict[str, Any] | None = None
        try:
            data = msgspec.json.decode((path.parent / f"{sha}.manifest.json").read_bytes())
            manifest = data if isinstance(data, dict) else None
        except (OSError, msgspec.DecodeError):
            manifest = None
        return StoreEntry(path=path, name=path.parent.name, sha256=sha, manifest=manifest)

    def _object(self, rel: object) -> Path | None:
        """The object a root-relative path names, if it is a model file under ``objects/``."""
        if not isinstance(rel, str):
            return None
        parts = Path(rel).parts
        if (len(parts) != 3 or parts[0] != "objects" or ".." in parts
                or not parts[2].endswith(_MODEL_EXTS)):
            logger.error("store: ignoring %r, which is not an object of the store", rel)
            return None
        return self.root / rel

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    # -- links -----------------------------------------------------------------------------
    def _pipeline_dir(self, pipeline: str) -> Path:
        if not _PIPELINE.fullmatch(pipeline):
            raise ValueError(f"pipeline name {pipeline!r} must match [A-Za-z0-9_-]{{1,64}}")
        return self.pipelines / pipeline

    def _target(self, link: Path) -> Path | None:
        """The object ``link`` points at (None: no link, or one that points elsewhere)."""
        try:
            target = os.readlink(link)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:  # EINVAL: not a symlink
            logger.warning("store: %s is not a symlink (%s); ignoring it", link, exc)
            return None
        path = Path(os.path.normpath(link.parent / target))
        try:
            return self._object(self._rel(path))
        except ValueError:
            logger.error("store: %s points outside the store (%s); ignoring it", link, target)
            return None

    def _link_entry(self, pipeline: str, which: str) -> StoreEntry | None:
        path = self._target(self._pipeline_dir(pipeline) / which)
        if path is None or not path.is_file():
            return None
        return self._entry(path)

    def current(self, pipeline: str) -> StoreEntry | None:
        """The model ``pipeline`` runs from the store, or None (it runs its configured model)."""
        return self._link_entry(pipeline, "current")

    def previous(self, pipeline: str) -> StoreEntry | None:
        """The model ``pipeline`` ran before its current one, or None."""
        return self._link_entry(pipeline, "previous")

    def pending(self, pipeline: str) -> dict[str, Any] | None:
        """The update of ``pipeline`` applied but not committed (``pending.json``), or None.

        Keys: ``new``, ``old``, ``old_previous`` (paths relative to the store's root, or None),
        ``update`` (what ``begin`` was given) and ``ts``. An unreadable file reads as an update
        from nothing (so rolling it back returns the pipeline to its configured model).
        """
        path = self._pipeline_dir(pipeline) / _PENDING
        try:
            data = msgspec.json.decode(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError) as exc:
            logger.error("store: %s is unreadable (%s); treating it as an update from no model",
                         path, exc)
            data = None
        if not isinstance(data, dict):
            data = {"new": None, "old": None, "old_previous": None, "update": {}, "ts": 0.0}
        return data

    # -- transitions -----------------------------------------------------------------------
    def begin(self, pipeline: str, entry: StoreEntry, *, update: dict[str, Any] | None = None) -> None:
        """Make ``entry`` the current model of ``pipeline``, pending a commit.

        Writes ``pending.json`` first, then moves ``previous`` to the old current model, then
        ``current`` to ``entry``; a crash between any two steps is undone by ``recover``.

        Args:
            pipeline: the pipeline's name.
            entry: an object of this store (from ``add``).
            update: details the caller wants back after a restart (version, transfer...).

        Raises:
            OtaRejected: ``busy`` when an update of ``pipeline`` is already pending.
            ValueError: ``entry`` is not an object of this store.
        """
        folder = self._pipeline_dir(pipeline)
        folder.mkdir(parents=True, exist_ok=True)
        if (folder / _PENDING).exists():
            raise OtaRejected("busy", f"an update of pipeline {pipeline!r} is already pending; "
                                      "commit or roll it back first")
        new = self._object(self._rel(Path(entry.path)))
        if new is None or not new.is_file():
            raise ValueError(f"{entry.path} is not a model in the store {self.root}")
        old = self._target(folder / "current")
        old_previous = self._target(folder / "previous")
        write_atomic(folder / _PENDING, msgspec.json.encode({
            "new": self._rel(new),
            "old": self._rel(old) if old is not None else None,
            "old_previous": self._rel(old_previous) if old_previous is not None else None,
            "update": update or {},
            "ts": time.time(),
        }))
        if old != new:
            _switch_link(folder / "previous", old)
        _switch_link(folder / "current", new)
        logger.info("store: pipeline %s now on %s (pending commit)", pipeline, self._rel(new))

    def commit(self, pipeline: str) -> None:
        """Make the pending update of ``pipeline`` permanent and prune its model's name (and the
        old model's). Nothing pending: nothing to do."""
        folder = self._pipeline_dir(pipeline)
        pend = self.pending(pipeline)
        if pend is None:
            return
        (folder / _PENDING).unlink(missing_ok=True)
        fsync_dir(folder)
        logger.info("store: pipeline %s committed %s", pipeline, pend.get("new"))
        names = {p.parent.name for key in ("new", "old")
                 if (p := self._object(pend.get(key))) is not None}
        for name in sorted(names):
            self.prune(name)

    def rollback_pending(self, pipeline: str) -> StoreEntry | None:
        """Undo the pending update of ``pipeline``: ``current`` back to the old model (no link
        if there was none), ``previous`` back to what it was, ``pending.json`` removed.

        Returns:
            The entry now current; None when the pipeline runs its configured model.
        """
        folder = self._pipeline_dir(pipeline)
        pend = self.pending(pipeline)
        if pend is None:
            return self.current(pipeline)
        old = self._object(pend.get("old"))
        if old is not None and not old.is_file():
            logger.error("store: the model pipeline %s ran before its update, %s, is gone; it goes "
                         "back to its configured model", pipeline, old)
            old = None
        old_previous = self._object(pend.get("old_previous"))
        if old_previous is not None and not old_previous.is_file():
            old_previous = None
        _switch_link(folder / "current", old)
        _switch_link(folder / "previous", old_previous)
        (folder / _PENDING).unlink(missing_ok=True)
        fsync_dir(folder)
        logger.info("store: pipeline %s rolled back from %s to %s", pipeline, pend.get("new"),
                    self._rel(old) if old is not None else "its configured model")
        return self._entry(old) if old is not None else None

    def rollback(self, pipeline: str) -> StoreEntry:
        """Swap ``current`` and ``previous`` of ``pipeline`` (a requested rollback).

        Returns:
            The entry now current (the former previous).

        Raises:
            OtaRejected: ``no_previous`` when there is no previous model; ``busy`` when an update
                is pending (that one is undone with ``rollback_pending``).
        """
        folder = self._pipeline_dir(pipeline)
        if (folder / _PENDING).exists():
            raise OtaRejected("busy", f"an update of pipeline {pipeline!r} is pending; it is rolled "
                                      "back by its health gate")
        prev = self._target(folder / "previous")
        if prev is None or not prev.is_file():
            raise OtaRejected("no_previous", f"pipeline {pipeline!r} has no previous model to go back to")
        cur = self._target(folder / "current")
        _switch_link(folder / "current", prev)
        _switch_link(folder / "previous", cur if cur is not None and cur.is_file() else None)
        logger.info("store: pipeline %s rolled back to %s", pipeline, self._rel(prev))
        return self._entry(prev)

    def recover(self) -> dict[str, StoreEntry | None]:
        """Put the store in order at boot.

        Removes every ``*.tmp`` under the root, rolls back every pending update and removes
        links that point at nothing (with a warning).

        Returns:
            ``{pipeline: entry now current}`` for the pipelines whose pending update was rolled
            back (None: the pipeline runs its configured model); the others are untouched.
        """
        for tmp in sorted(self.root.rglob("*.tmp"), key=lambda p: len(p.parts), reverse=True):
            logger.info("store: removing leftover %s", tmp)
            remove_path(tmp)
        rolled: dict[str, StoreEntry | None] = {}
        for folder in self.pipeline_dirs():
            if (folder / _PENDING).exists():
                logger.warning("store: pipeline %s had an uncommitted update; rolling it back",
                               folder.name)
                rolled[folder.name] = self.rollback_pending(folder.name)
            for which in _LINKS:
                link = folder / which
                if os.path.lexists(link) and not link.exists():
                    logger.warning("store: removing dangling link %s -> %s", link, os.readlink(link))
                    _switch_link(link, None)
        return rolled

    def pipeline_dirs(self) -> Iterator[Path]:
        """The store's per-pipeline folders (real folders with a pipeline's name, no links)."""
        for folder in sorted(self.pipelines.iterdir()):
            if folder.is_dir() and not folder.is_symlink() and _PIPELINE.fullmatch(folder.name):
                yield folder

    def _referenced(self) -> set[Path]:
        refs: set[Path] = set()
        for folder in self.pipeline_dirs():
            for which in _LINKS:
                if (target := self._target(folder / which)) is not None:
                    refs.add(target)
            pend = self.pending(folder.name)
            if pend is not None:
                for key in ("new", "old", "old_previous"):
                    if (target := self._object(pend.get(key))) is not None:
                        refs.add(target)
        return refs

    def prune(self, name: str) -> list[Path]:
        """Remove old objects of model ``name``: the newest ``keep`` (by mtime) stay, besides
        any that a ``current``/``previous`` link or a ``pending.json`` references.

        Returns:
            The files removed (models, manifests, signatures).
        """
        folder = self.objects / name
        if not folder.is_dir() or ".." in name or "/" in name:
            return []
        refs = self._referenced()
        models = [p for p in folder.iterdir() if p.name.endswith(_MODEL_EXTS) and p not in refs]
        models.sort(key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)
        removed: list[Path] = []
        for model in models[self.keep:]:
            sha = model.name.split(".", 1)[0]
            for path in (model, folder / f"{sha}.manifest.json", folder / f"{sha}.sig"):
                if os.path.lexists(path):
                    path.unlink()
                    removed.append(path)
        if removed:
            fsync_dir(folder)
            logger.info("store: pruned %d old object(s) of %s", len(models) - self.keep, name)
        return removed

    # -- staging ---------------------------------------------------------------------------
    def staging_dir(self, transfer: str) -> Path:
        """``staging/<transfer>``, created."""
        if not _TRANSFER.fullmatch(transfer):
            raise ValueError(f"transfer id {transfer!r} must match [A-Za-z0-9_-]{{1,64}}")
        path = self.staging / transfer
        path.mkdir(parents=True, exist_ok=True)
        return path

    def clear_staging(self, transfer: str | None = None) -> None:
        """Remove one transfer's staging folder, or (None) every one."""
        if transfer is not None:
            if not _TRANSFER.fullmatch(transfer):
                raise ValueError(f"transfer id {transfer!r} must match [A-Za-z0-9_-]{{1,64}}")
            shutil.rmtree(self.staging / transfer, ignore_errors=True)
            return
        for path in self.staging.iterdir():
            remove_path(path)
