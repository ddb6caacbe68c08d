"""The outbox file itself: one process at a time, ids from SQLite, whom the file is for, a
damaged file moved aside and salvaged, a full disk at creation; and the state-directory lock."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeinfer.errors import AlreadyRunningError, StorageError
from edgeinfer.mqtt.outbox import Outbox
from edgeinfer.paths import outbox_path
from edgeinfer.statelock import StateLock
from outbox_damage import damage, full_tmpfs

ROOT = Path(__file__).resolve().parents[2]

_HOLDER = """
import sys, time
from edgeinfer.mqtt.outbox import Outbox
from edgeinfer.statelock import StateLock
held = Outbox(sys.argv[1]) if sys.argv[2] == "outbox" else StateLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def _hold(path: Path, kind: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), kind],
                            stdout=subprocess.PIPE, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


def _kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.mark.parametrize("kind", ["outbox", "lock"])
def test_a_second_process_is_refused_with_the_first_ones_pid_until_it_dies(
        tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("o.sqlite3" if kind == "outbox" else "edgeinfer.lock")
    holder = _hold(path, kind)
    try:
        with pytest.raises(AlreadyRunningError, match=f"pid {holder.pid}") as err:
            Outbox(path) if kind == "outbox" else StateLock(path).acquire()
        assert err.value.exit_code == 75 and "-c" in str(err.value)  # its command line
        assert ("mqtt.outbox.path" if kind == "outbox" else "runtime.state_dir") in str(err.value)
    finally:
        _kill(holder)  # kill -9: the kernel drops the flock, the stale file does not matter
    if kind == "outbox":
        with Outbox(path) as ob:
            ob.put("a", 1, "t", b"x")
    else:
        with StateLock(path) as lock:
            assert lock.held and StateLock.owner(path)["pid"] == os.getpid()


def test_ids_come_from_sqlite_and_are_never_reused(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox(path) as ob:
        ob.put("a", 1, "t", b"x")
        ob.put("a", 2, "t", b"x")
        ob.ack_many(m.id for m in ob.take(10))
        assert ob.depth == 0
    with Outbox(path) as ob:  # the table is empty: an id after the old ones all the same
        ob.put("a", 3, "t", b"x")
        (msg,) = ob.take(10)
        assert msg.id == 3 and msg.seq == 3


def test_an_outbox_from_before_sqlite_gave_the_ids_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE messages (id INTEGER PRIMARY KEY, pipeline TEXT NOT NULL,
            seq INTEGER NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
            qos INTEGER NOT NULL, created REAL NOT NULL);
        CREATE TABLE last_seq (pipeline TEXT PRIMARY KEY, seq INTEGER NOT NULL);
        INSERT INTO messages VALUES (7, 'a', 40, 't', x'00', 1, 0), (9, 'a', 41, 't', x'00', 1, 0);
    """)
    conn.close()
    with Outbox(path) as ob:
        ob.put("a", 42, "t", b"x")
        assert [(m.id, m.seq) for m in ob.take(10)] == [(7, 40), (9, 41), (10, 42)]
        (sql,) = ob._conn.execute("SELECT sql FROM sqlite_master WHERE name = 'messages'").fetchone()
        assert "AUTOINCREMENT" in sql


def test_a_file_of_another_device_or_broker_is_moved_aside_not_published(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox(path, owner="b@10.0.0.9:1883") as ob:
        ob.put("p", 1, "edgeinfer/b/p/result", b"for b")
    with Outbox(path, owner="a@127.0.0.1:1883") as ob:
        assert ob.take(10) == [] and ob.recovered is not None
        assert "b@10.0.0.9:1883" in ob.recovered.reason
        aside = Path(ob.recovered.moved_to)
    assert aside.name.startswith("o.sqlite3.foreign-")
    with Outbox(aside, owner="b@10.0.0.9:1883") as kept:  # whoever it belongs to can send it
        assert [m.payload for m in kept.take(10)] == [b"for b"]


def test_default_paths_differ_per_device_and_broker(tmp_path: Path) -> None:
    paths = {outbox_path(tmp_path, dev, host, port) for dev, host, port in [
        ("a", "127.0.0.1", 1883), ("b", "127.0.0.1", 1883), ("a", "127.0.0.1", 1884),
        ("a", "broker", 1883), ("a b", "::1", 1883), ("a_b", "::1", 1883)]}
    assert len(paths) == 6 and all(p.parent == tmp_path for p in paths)
    assert outbox_path(tmp_path, "pi", "127.0.0.1", 1883).name == "outbox-pi@127.0.0.1-1883.sqlite3"


@pytest.mark.parametrize("how,salvaged", [("header", (0, 0)), ("truncated", (500, 1500)),
                                          ("page", (1900, 1999)), ("directory", (0, 0))])
def test_a_damaged_outbox_is_moved_aside_and_what_can_be_read_is_kept(
        tmp_path: Path, how: str, salvaged: tuple[int, int],
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "o.sqlite3"
    damage(path, how)
    before_ms = int(time.time() * 1000)
    with Outbox(path) as ob:
        rec = ob.recovered
        assert rec is not None and rec.unreadable
        # what was lost had unknown seqs: every pipeline counts on above the recovery time
        assert ob.last_seq("a") >= before_ms and ob.last_seq("other") >= before_ms
        assert salvaged[0] <= rec.salvaged <= salvaged[1] and ob.depth == rec.salvaged
        seqs = [m.seq for m in ob.take(10_000)]
        assert seqs == sorted(seqs) and len(seqs) == rec.salvaged
        ob.put("a", 5000, "edgeinfer/dev/a/result", b"new")  # a working outbox
        assert ob.take(10)[-1].seq == 5000
        assert ob.stats()["recovered"]["moved_to"] == rec.moved_to
    aside = Path(rec.moved_to)
    assert aside.name.startswith("o.sqlite3.damaged-") and aside.exists()  # kept
    assert (aside.is_dir() if how == "directory" else aside.stat().st_size > 0)
    assert f"moved it aside to {aside}" in caplog.text


def test_a_full_disk_at_creation_is_a_clear_error_naming_the_file(tmp_path: Path) -> None:
    with full_tmpfs(tmp_path / "tiny") as tiny_fs:
        path = tiny_fs / "state" / "outbox.sqlite3"
        with pytest.raises(StorageError, match="disk is full") as err:
            Outbox(path)
        assert str(path) in str(err.value) and err.value.exit_code == 73
        assert not list(tiny_fs.glob("state/outbox.sqlite3.damaged-*"))  # not mistaken for damage


def test_results_in_the_outbox_an_older_version_shared_go_to_the_device_they_are_for(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from edgeinfer.config.mqtt import MqttConfig
    from edgeinfer.mqtt.publisher import MqttPlumbing

    legacy = tmp_path / "outbox.sqlite3"
    conn = sqlite3.connect(legacy)  # as versions before one outbox per device left it
    conn.executescript("""
        CREATE TABLE messages (id INTEGER PRIMARY KEY, pipeline TEXT NOT NULL,
            seq INTEGER NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
            qos INTEGER NOT NULL, created REAL NOT NULL);
        CREATE TABLE last_seq (pipeline TEXT PRIMARY KEY, seq INTEGER NOT NULL);
        INSERT INTO last_seq VALUES ('door', 40);
        INSERT INTO messages VALUES (1, 'door', 41, 'edgeinfer/a/door/result', x'01', 1, 0),
            (2, 'door', 7, 'edgeinfer/b/door/result', x'02', 1, 0),
            (3, 'door', 42, 'edgeinfer/a/door/result', x'03', 1, 0);
    """)
    conn.close()
    plumbing = MqttPlumbing(MqttConfig(port=1), "a", tmp_path)
    try:
        assert [(m.seq, m.topic) for m in plumbing.outbox.take(10)] == [
            (41, "edgeinfer/a/door/result"), (42, "edgeinfer/a/door/result")]
        assert plumbing.outbox.path == outbox_path(tmp_path, "a", "127.0.0.1", 1)
    finally:
        plumbing.stop()
    assert "took 2 results waiting in" in caplog.text
    with Outbox(legacy) as old:  # b's result waits there for b
        assert [m.topic for m in old.take(10)] == ["edgeinfer/b/door/result"]
    plumbing = MqttPlumbing(MqttConfig(port=1), "c", tmp_path)  # a device with nothing waiting
    try:
        assert plumbing.outbox.depth == 0 and plumbing.last_seq("door") == 40  # never goes back
    finally:
        plumbing.stop()


def test_results_of_another_device_in_an_explicit_outbox_are_set_aside_not_published(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from edgeinfer.config.mqtt import MqttConfig, OutboxConfig
    from edgeinfer.mqtt.publisher import MqttPlumbing

    shared = tmp_path / "shared.db"  # one mqtt.outbox.path in two configs, before owners
    conn = sqlite3.connect(shared)
    conn.executescript("""
        CREATE TABLE messages (id INTEGER PRIMARY KEY, pipeline TEXT NOT NULL,
            seq INTEGER NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
            qos INTEGER NOT NULL, created REAL NOT NULL);
        INSERT INTO messages VALUES (1, 'door', 5, 'site/a/door/result', x'01', 1, 0),
            (2, 'door', 9, 'site/b/door/result', x'02', 1, 0),
            (3, 'door', 6, 'site/a/door/result', x'03', 1, 0);
    """)
    conn.close()
    config = MqttConfig(port=1, prefix="site", outbox=OutboxConfig(path=str(shared)))
    plumbing = MqttPlumbing(config, "a", tmp_path / "state")
    try:
        assert [m.topic for m in plumbing.outbox.take(10)] == ["site/a/door/result"] * 2
        assert plumbing.stats()["depth"] == 2
    finally:
        plumbing.stop()
    (aside,) = tmp_path.glob("shared.db.foreign-*")
    assert f"held 1 results of other devices; moved them to {aside}" in caplog.text
    with Outbox(aside) as kept:
        assert [(m.seq, m.topic) for m in kept.take(10)] == [(9, "site/b/door/result")]


def test_a_plumbing_that_fails_to_build_leaves_its_outbox_unlocked(tmp_path: Path) -> None:
    from edgeinfer.config.mqtt import MqttConfig, TlsConfig
    from edgeinfer.errors import ConfigError
    from edgeinfer.mqtt.publisher import MqttPlumbing

    bad = MqttConfig(port=1, tls=TlsConfig(ca_file=str(tmp_path / "missing-ca.pem")))
    with pytest.raises(ConfigError):
        MqttPlumbing(bad, "a", tmp_path)
    plumbing = MqttPlumbing(MqttConfig(port=1), "a", tmp_path)  # same outbox, same process
    plumbing.stop()


def test_a_lock_file_saying_odd_things_still_gives_a_clear_refusal(tmp_path: Path) -> None:
    """The lock file is only informative: whatever another process wrote in it, the refusal is
    an AlreadyRunningError, not a TypeError from formatting it."""
    from edgeinfer.errors import AlreadyRunningError
    from edgeinfer.statelock import StateLock

    path = tmp_path / "edgeinfer.lock"
    with StateLock(path):
        for text in ('{"pid": [1], "since": "yesterday", "cmdline": {"a": 1}}', "[1, 2]",
                     '{"since": 1e300}', "\xff\xfe"):
            path.write_text(text, errors="surrogateescape")
            with pytest.raises(AlreadyRunningError, match="in use by"):
                StateLock(path).acquire()
