"""The content-addressed store and its links: add, begin/commit/rollback, recover after crashes,
prune. Real files and symlinks in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import pytest

from edgeinfer.errors import OtaRejected
from edgeinfer.ota.manifest import Manifest, Target, encode
from edgeinfer.ota.store import ModelStore, StoreEntry


def _model(tmp_path: Path, tag: str, name: str = "face", fmt: str = "onnx") -> tuple[Path, bytes]:
    """A fake model file (the store does not parse models) and its manifest text."""
    src = tmp_path / f"src-{name}-{tag}.{fmt}"
    data = f"model {name} {tag} ".encode() * 50
    src.write_bytes(data)
    m = Manifest(name=name, pipeline="faces", version=tag, sha256=hashlib.sha256(data).hexdigest(),
                 size=len(data), format=fmt, filename=src.name,  # type: ignore[arg-type]
                 target=Target(device="pi"), sequence=1, created="2026-11-21T12:00:00Z",
                 expires="2026-11-21T13:00:00Z", chunk_size=65536,
                 chunks=[hashlib.sha256(data).hexdigest()])
    return src, encode(m)


def _add(store: ModelStore, tmp_path: Path, tag: str, name: str = "face", *,
         mtime: float | None = None) -> StoreEntry:
    src, text = _model(tmp_path, tag, name)
    entry = store.add(src, text, None)
    if mtime is not None:
        os.utime(entry.path, (mtime, mtime))
    return entry


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    return ModelStore(tmp_path / "state" / "ota", keep=2)


def _tmp_files(store: ModelStore) -> list[Path]:
    return [p for p in store.root.rglob("*") if p.name.endswith(".tmp")]


def _link(store: ModelStore, pipeline: str, which: str) -> str | None:
    link = store.pipelines / pipeline / which
    return os.readlink(link) if os.path.lexists(link) else None


def test_layout_created(store: ModelStore) -> None:
    assert all((store.root / d).is_dir() for d in ("objects", "pipelines", "staging"))


def test_add_is_content_addressed_and_idempotent(store: ModelStore, tmp_path: Path) -> None:
    src, text = _model(tmp_path, "1")
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    entry = store.add(src, text, "c2lnbmF0dXJl")
    assert entry.path == store.root / "objects" / "face" / f"{sha}.onnx"
    assert entry.name == "face" and entry.sha256 == sha
    assert entry.manifest is not None and entry.manifest["version"] == "1"
    assert entry.path.read_bytes() == src.read_bytes()
    assert stat.S_IMODE(entry.path.stat().st_mode) == 0o444
    assert (entry.path.parent / f"{sha}.manifest.json").read_bytes() == text
    assert (entry.path.parent / f"{sha}.sig").read_text() == "c2lnbmF0dXJl"
    inode = entry.path.stat().st_ino
    assert store.add(src, text, "c2lnbmF0dXJl") == entry
    assert entry.path.stat().st_ino == inode  # kept, not rewritten
    # a truncated object (size mismatch) is rewritten
    os.chmod(entry.path, 0o644)
    entry.path.write_bytes(b"short")
    assert store.add(src, text, None).path.read_bytes() == src.read_bytes()
    assert _tmp_files(store) == []
    # TFLite objects get their extension from the manifest
    src2, text2 = _model(tmp_path, "t", fmt="tflite")
    assert store.add(src2, text2, None).path.suffix == ".tflite"


def test_add_refuses_a_file_that_is_not_the_manifests(store: ModelStore, tmp_path: Path) -> None:
    src, text = _model(tmp_path, "1")
    other, _ = _model(tmp_path, "2")
    with pytest.raises(OtaRejected) as err:
        store.add(other, text, None)
    assert err.value.reason in ("size_mismatch", "sha256_mismatch")
    src.write_bytes(src.read_bytes()[:-1] + b"X")  # same size, other bytes
    with pytest.raises(OtaRejected) as err:
        store.add(src, text, None)
    assert err.value.reason == "sha256_mismatch"
    assert list((store.objects / "face").iterdir()) == []  # nothing, not even a manifest
    with pytest.raises(OtaRejected) as err:
        store.add(src, b'{"name": "../x"}', None)
    assert err.value.reason == "bad_manifest"


def test_begin_commit_links_are_relative(store: ModelStore, tmp_path: Path) -> None:
    a = _add(store, tmp_path, "1")
    assert store.current("faces") is None and store.previous("faces") is None
    store.begin("faces", a, update={"version": "1"})
    assert _link(store, "faces", "current") == f"../../objects/face/{a.sha256}.onnx"
    assert _link(store, "faces", "previous") is None
    assert store.current("faces") == a
    pend = store.pending("faces")
    assert pend is not None and pend["new"] == f"objects/face/{a.sha256}.onnx"
    assert pend["old"] is None and pend["old_previous"] is None and pend["update"] == {"version": "1"}
    store.commit("faces")
    assert store.pending("faces") is None and store.current("faces") == a
    b = _add(store, tmp_path, "2")
    store.begin("faces", b)
    with pytest.raises(OtaRejected) as err:
        store.begin("faces", b)
    assert err.value.reason == "busy"
    store.commit("faces")
    assert store.current("faces") == b and store.previous("faces") == a
    assert _link(store, "faces", "previous") == f"../../objects/face/{a.sha256}.onnx"
    # links still resolve when the whole state folder moves
    moved = tmp_path / "moved"
    store.root.parent.rename(moved)
    assert ModelStore(moved / "ota").current("faces") is not None
    assert _tmp_files(store) == []


def test_rollback_pending_restores_old_links(store: ModelStore, tmp_path: Path) -> None:
    a, b, c = (_add(store, tmp_path, t) for t in "abc")
    # first update ever rolled back: back to the configured model
    store.begin("faces", a)
    assert store.rollback_pending("faces") is None
    assert _link(store, "faces", "current") is None and store.pending("faces") is None
    store.begin("faces", a)
    store.commit("faces")
    store.begin("faces", b)
    store.commit("faces")
    store.begin("faces", c)
    assert (store.current("faces"), store.previous("faces")) == (c, b)
    assert store.rollback_pending("faces") == b
    assert (store.current("faces"), store.previous("faces")) == (b, a)
    assert store.pending("faces") is None
    assert store.rollback_pending("faces") == b  # nothing pending: no change


def test_requested_rollback_swaps_current_and_previous(store: ModelStore, tmp_path: Path) -> None:
    a, b = _add(store, tmp_path, "a"), _add(store, tmp_path, "b")
    with pytest.raises(OtaRejected) as err:
        store.rollback("faces")
    assert err.value.reason == "no_previous"
    store.begin("faces", a)
    store.commit("faces")
    with pytest.raises(OtaRejected) as err:
        store.rollback("faces")
    assert err.value.reason == "no_previous"
    store.begin("faces", b)
    with pytest.raises(OtaRejected) as err:
        store.rollback("faces")
    assert err.value.reason == "busy"
    store.commit("faces")
    assert store.rollback("faces") == a
    assert (store.current("faces"), store.previous("faces")) == (a, b)
    assert store.rollback("faces") == b  # and back again


def _state(store: ModelStore) -> tuple[str | None, str | None, bool]:
    return (_link(store, "faces", "current"), _link(store, "faces", "previous"),
            (store.pipelines / "faces" / "pending.json").exists())


def _rel(e: StoreEntry) -> str:
    return f"../../objects/{e.name}/{e.path.name}"


@pytest.mark.parametrize("crash_after", ["pending", "previous", "current"])
def test_recover_after_crash_in_begin(store: ModelStore, tmp_path: Path, crash_after: str) -> None:
    """pending.json written, then previous switched, then current switched: a crash after any
    step (with link temporaries lying around) ends on the old model after recover."""
    a, b, c = (_add(store, tmp_path, t) for t in "abc")
    store.begin("faces", a)
    store.commit("faces")
    store.begin("faces", b)
    store.commit("faces")
    before = _state(store)
    assert before == (_rel(b), _rel(a), False)
    folder = store.pipelines / "faces"
    # step 1, by hand: the pending record, as begin writes it
    (folder / "pending.json").write_text(json.dumps({
        "new": f"objects/face/{c.path.name}", "old": f"objects/face/{b.path.name}",
        "old_previous": f"objects/face/{a.path.name}", "update": {}, "ts": time.time()}))
    os.symlink(_rel(c), folder / "previous.tmp")  # a link switch cut short
    if crash_after in ("previous", "current"):
        os.replace(folder / "previous.tmp", folder / "previous")
        os.unlink(folder / "previous")
        os.symlink(_rel(b), folder / "previous")
    if crash_after == "current":
        os.unlink(folder / "current")
        os.symlink(_rel(c), folder / "current")
    (folder / "pending.json.tmp").write_text("{half")
    (c.path.parent / f"{c.path.name}.tmp").write_bytes(b"partial copy")
    (store.staging_dir("0123456789abcdef") / "model.part.tmp").write_bytes(b"x")
    rolled = store.recover()
    assert rolled == {"faces": b}
    assert _state(store) == before
    assert _tmp_files(store) == []
    assert store.current("faces") == b and store.current("faces").path.read_bytes()  # type: ignore[union-attr]


def test_recover_after_crash_during_first_update(store: ModelStore, tmp_path: Path) -> None:
    a = _add(store, tmp_path, "a")
    folder = store.pipelines / "faces"
    folder.mkdir()
    (folder / "pending.json").write_text(json.dumps({
        "new": f"objects/face/{a.path.name}", "old": None, "old_previous": None, "update": {},
        "ts": time.time()}))
    os.symlink(_rel(a), folder / "current")
    assert store.recover() == {"faces": None}
    assert _state(store) == (None, None, False)


def test_recover_real_begin_then_crash(store: ModelStore, tmp_path: Path) -> None:
    a, b = _add(store, tmp_path, "a"), _add(store, tmp_path, "b")
    store.begin("faces", a)
    store.commit("faces")
    store.begin("faces", b, update={"transfer": "x"})  # the daemon dies before the commit
    fresh = ModelStore(store.root)
    assert fresh.recover() == {"faces": a}
    assert (fresh.current("faces"), fresh.previous("faces"), fresh.pending("faces")) == (a, None, None)
    assert fresh.recover() == {}  # nothing left to do


def test_recover_drops_dangling_links_and_corrupt_pending(store: ModelStore, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    a, b = _add(store, tmp_path, "a"), _add(store, tmp_path, "b")
    store.begin("faces", a)
    store.commit("faces")
    store.begin("faces", b)
    store.commit("faces")
    os.unlink(a.path)  # someone removed the previous object by hand
    with caplog.at_level("WARNING"):
        assert store.recover() == {}
    assert _link(store, "faces", "previous") is None and store.current("faces") == b
    assert any("dangling" in r.getMessage() for r in caplog.records)
    (store.pipelines / "faces" / "pending.json").write_text("garbage")
    assert store.recover() == {"faces": None}
    assert _state(store) == (None, None, False)


def test_prune_keeps_newest_plus_referenced(store: ModelStore, tmp_path: Path) -> None:
    now = time.time()
    entries = [_add(store, tmp_path, str(i), mtime=now - 100 + i) for i in range(6)]
    other = _add(store, tmp_path, "x", name="other", mtime=now - 1000)
    # pipeline "faces": current = entries[0] (oldest); "cam": pending on entries[1]
    store.begin("faces", entries[0])
    store.begin("cam", entries[1])
    store.commit("faces")  # prunes "face"
    kept = {p.name for p in (store.objects / "face").iterdir()}
    # keep=2 newest unreferenced (4, 5) + current of faces (0) + pending of cam (1)
    assert kept == {n for i in (0, 1, 4, 5)
                    for n in (entries[i].path.name, f"{entries[i].sha256}.manifest.json")}
    store.rollback_pending("cam")  # entries[1] is referenced no more
    os.utime(entries[1].path, (now - 500, now - 500))
    removed = store.prune("face")
    assert removed == [entries[1].path, entries[1].path.parent / f"{entries[1].sha256}.manifest.json"]
    assert not any(p.exists() for p in removed)
    assert other.path.exists()  # another name is untouched
    assert store.prune("face") == []
    assert store.prune("missing") == []


def test_commit_prunes(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "ota", keep=1)
    now = time.time()
    entries = [_add(store, tmp_path, str(i), mtime=now - 100 + i) for i in range(4)]
    store.begin("faces", entries[0])
    store.commit("faces")  # keeps current (0) and the newest other (3)
    assert {p.name for p in (store.objects / "face").glob("*.onnx")} == {
        entries[0].path.name, entries[3].path.name}
    new = _add(store, tmp_path, "4")
    store.begin("faces", new)
    store.commit("faces")
    # current (4), previous (0), the newest unreferenced one (3)
    assert {p.name for p in (store.objects / "face").glob("*.onnx")} == {
        new.path.name, entries[0].path.name, entries[3].path.name}


def test_staging(store: ModelStore) -> None:
    a = store.staging_dir("0123456789abcdef")
    b = store.staging_dir("fedcba9876543210")
    assert a.is_dir() and a.parent == store.staging and store.staging_dir("0123456789abcdef") == a
    (a / "data").write_bytes(b"x")
    store.clear_staging("0123456789abcdef")
    assert not a.exists() and b.exists()
    store.clear_staging()
    assert list(store.staging.iterdir()) == []
    with pytest.raises(ValueError):
        store.staging_dir("../escape")
    with pytest.raises(ValueError):
        store.current("../x")


def test_begin_with_the_current_model_keeps_previous(store: ModelStore, tmp_path: Path) -> None:
    a, b = _add(store, tmp_path, "a"), _add(store, tmp_path, "b")
    for e in (a, b):
        store.begin("faces", e)
        store.commit("faces")
    store.begin("faces", b)
    assert (store.current("faces"), store.previous("faces")) == (b, a)
    assert store.rollback_pending("faces") == b
    assert (store.current("faces"), store.previous("faces")) == (b, a)
