"""The durable outbox on a real SQLite file: order, acks, bounds, expiry, restarts, crashes."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgeinfer.config.mqtt import OutboxConfig
from edgeinfer.errors import StateError
from edgeinfer.mqtt import outbox
from edgeinfer.mqtt.outbox import Outbox

ROOT = Path(__file__).resolve().parents[2]


def _put(ob: Outbox, pipeline: str, seqs: range, size: int = 100) -> None:
    for seq in seqs:
        ob.put(pipeline, seq, f"edgeinfer/dev/{pipeline}/result", b"x" * size, 1)


def test_oldest_first_and_in_order_per_pipeline(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as ob:
        for seq in range(1, 6):
            _put(ob, "a", range(seq, seq + 1))
            _put(ob, "b", range(seq * 10, seq * 10 + 1))
        got = ob.take(100)
        assert [m.seq for m in got if m.pipeline == "a"] == [1, 2, 3, 4, 5]
        assert [m.seq for m in got if m.pipeline == "b"] == [10, 20, 30, 40, 50]
        assert [m.id for m in got] == sorted(m.id for m in got)
        assert got[0].topic == "edgeinfer/dev/a/result" and got[0].qos == 1


def test_take_skips_in_flight_and_ack_deletes(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as ob:
        _put(ob, "a", range(1, 11))
        first = ob.take(4)
        second = ob.take(4)
        assert [m.seq for m in first] == [1, 2, 3, 4]
        assert [m.seq for m in second] == [5, 6, 7, 8]
        assert ob.in_flight == 8
        ob.ack(first[0].id)
        assert ob.ack_many(m.id for m in first[1:]) == 3
        assert ob.ack_many([first[0].id]) == 0  # an ack that comes twice is ignored
        stats = ob.stats()
        assert stats["depth"] == 6 and stats["in_flight"] == 4 and stats["acked"] == 4
        assert stats["bytes"] == 600
        assert [m.seq for m in ob.take(10)] == [9, 10]
        assert ob.take(10) == []


def test_requeue_puts_in_flight_back_in_order(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as ob:
        _put(ob, "a", range(1, 8))
        taken = ob.take(5)
        ob.ack(taken[1].id)
        assert ob.requeue() == 4
        assert ob.in_flight == 0
        assert [m.seq for m in ob.take(100)] == [1, 3, 4, 5, 6, 7]


def test_restart_puts_in_flight_back(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as ob:
        _put(ob, "a", range(1, 6))
        ob.ack(ob.take(3)[0].id)  # 2 and 3 in flight when the process goes away
    with Outbox(tmp_path / "o.db") as ob:
        assert ob.depth == 4
        assert [m.seq for m in ob.take(100)] == [2, 3, 4, 5]


def test_max_messages_drops_oldest_and_counts(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", OutboxConfig(max_messages=100)) as ob:
        _put(ob, "a", range(1, 251))
        stats = ob.stats()
        assert stats["depth"] == 100
        assert stats["dropped"] == 150 and stats["dropped_by"]["max_messages"] == 150
        assert [m.seq for m in ob.take(1000)] == list(range(151, 251))


def test_max_mb_drops_oldest_and_counts(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", OutboxConfig(max_mb=0.01)) as ob:  # 10,485 bytes
        _put(ob, "a", range(1, 101), size=1000)
        stats = ob.stats()
        assert stats["depth"] == 10 and stats["bytes"] == 10_000
        assert stats["dropped_by"]["max_mb"] == 90
        assert [m.seq for m in ob.take(100)] == list(range(91, 101))
    with Outbox(tmp_path / "o.db", OutboxConfig(max_mb=0.01)) as ob:  # counters rebuilt on open
        assert ob.stats()["bytes"] == 10_000


def test_dropping_in_flight_results_keeps_counts_right(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", OutboxConfig(max_messages=10)) as ob:
        _put(ob, "a", range(1, 11))
        taken = ob.take(5)
        _put(ob, "a", range(11, 14))  # pushes out 1..3 while they are in flight
        assert ob.in_flight == 2
        assert ob.ack_many(m.id for m in taken) == 2
        assert ob.stats()["depth"] == 8


def test_age_expiry(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", OutboxConfig(max_age_s=0.3)) as ob:
        _put(ob, "a", range(1, 21))
        assert ob.expire() == 0
        time.sleep(0.4)
        _put(ob, "a", range(21, 23))
        assert ob.expire() == 20
        assert [m.seq for m in ob.take(100)] == [21, 22]
        stats = ob.stats()
        assert stats["dropped_by"]["max_age"] == 20 and stats["depth"] == 2
        assert stats["oldest_age_s"] < 0.3


def test_put_expires_by_itself(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", OutboxConfig(max_age_s=0.2)) as ob:
        _put(ob, "a", range(1, 6))
        time.sleep(1.1)  # put checks the age at most once a second
        _put(ob, "a", range(6, 7))
        assert ob.stats()["dropped_by"]["max_age"] == 5


def test_rows_from_before_the_clock_was_set_do_not_expire(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db", OutboxConfig(max_age_s=1.0)) as ob:
        _put(ob, "a", range(1, 3))
    with sqlite3.connect(tmp_path / "o.db") as db:  # as if put on a board still in 1970
        db.execute("UPDATE messages SET created = 1000.0")
    with Outbox(tmp_path / "o.db", OutboxConfig(max_age_s=1.0)) as ob:
        assert ob.expire() == 0 and ob.depth == 2


def test_last_seq_survives_acks_drops_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "o.db"
    with Outbox(path, OutboxConfig(max_messages=5)) as ob:
        assert ob.last_seq("a") == 0
        _put(ob, "a", range(1, 9))  # 1..3 dropped
        _put(ob, "b", range(1, 3))  # pushes out 4, 5
        assert ob.last_seq("a") == 8 and ob.last_seq("b") == 2
        ob.ack_many(m.id for m in ob.take(100))  # the table is empty now
        assert ob.depth == 0
    with Outbox(path) as ob:
        assert ob.last_seq("a") == 8 and ob.last_seq("b") == 2 and ob.last_seq("c") == 0
        _put(ob, "a", range(9, 11))
    with Outbox(path) as ob:
        assert ob.last_seq("a") == 10


def test_full_disk_drops_oldest_and_never_raises(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with Outbox(tmp_path / "o.db") as ob:
        _put(ob, "a", range(1, 11), size=400)
        # SQLite's own page cap raises the same SQLITE_FULL a full file system does.
        (pages,) = ob._conn.execute("PRAGMA page_count").fetchone()
        ob._conn.execute(f"PRAGMA max_page_count = {pages + 30}")
        _put(ob, "a", range(11, 2001), size=400)  # ~800 KB into a ~150 KB cap
        stats = ob.stats()
        assert stats["dropped_by"]["disk_full"] > 0
        assert stats["depth"] + stats["dropped"] == 2000
        assert stats["disk_full"] is True
        seqs = [m.seq for m in ob.take(10_000)]
        assert seqs == sorted(seqs) and seqs[-1] == 2000
        ob._conn.execute("PRAGMA max_page_count = 1073741823")
        monkeypatch.setattr(outbox, "_DISK_FULL_QUIET_S", 0.0)
        _put(ob, "a", range(2001, 2002))
        assert ob.stats()["disk_full"] is False


def test_put_from_many_threads_while_draining(tmp_path: Path) -> None:
    with Outbox(tmp_path / "o.db") as ob:
        n, done = 2000, threading.Event()
        acked: list[int] = []

        def drain() -> None:
            while not done.is_set() or ob.depth:
                batch = ob.take(50)
                acked.extend(m.seq for m in batch if m.pipeline == "p0")
                ob.ack_many(m.id for m in batch)

        drainer = threading.Thread(target=drain)
        drainer.start()
        writers = [threading.Thread(target=_put, args=(ob, f"p{k}", range(1, n + 1)))
                   for k in range(3)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
        done.set()
        drainer.join(30)
        assert acked == list(range(1, n + 1))
        assert ob.stats()["acked"] == 3 * n and ob.depth == 0


def test_closed_outbox_refuses(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "o.db")
    ob.close()
    ob.close()
    with pytest.raises(StateError):
        ob.put("a", 1, "t", b"x", 1)


_CHILD = """
import sys
from edgeinfer.mqtt import outbox
from edgeinfer.mqtt.outbox import Outbox
ob = Outbox(sys.argv[1])
seq = ob.last_seq("a")
while True:
    seq += 1
    ob.put("a", seq, "edgeinfer/dev/a/result", b"%d" % seq * 40, 1)
    print(seq, flush=True)
"""


@pytest.mark.parametrize("round_", range(3))
def test_kill_9_loses_nothing_that_was_put(tmp_path: Path, round_: int) -> None:
    path = tmp_path / "o.db"
    rng = random.Random(round_)
    reported: list[int] = []
    for _ in range(2):  # twice on the same file: the second child continues the seq
        child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE,
                                 cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.stdout is not None
        reported.append(int(child.stdout.readline()))  # running; now kill it at a random point
        time.sleep(rng.uniform(0.05, 0.6))
        child.send_signal(signal.SIGKILL)
        reported.extend(int(line) for line in child.stdout.read().split())
        child.wait(10)
    with Outbox(path) as ob:
        stored = [m.seq for m in ob.take(10**6)]
        assert ob._conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert set(reported) <= set(stored)
    assert stored == sorted(stored) and len(stored) == len(set(stored))
    assert len(reported) > 50
