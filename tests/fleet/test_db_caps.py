"""Issue 31 item 2 against a real PostgreSQL: what one anonymous client can add to the disk is
bounded. ``rejected`` is capped per source and in all (the rest counted per source, with a
sample), a status is stored within ``status_max_bytes``, and devices unseen for
``retention_days`` are pruned. Sizes scaled from the issue's (5,000 x 64 KiB junk, 1,000 x
256 KiB statuses) to ones that cross the same caps in a second."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from edgeinfer.config.collect import DatabaseConfig, RejectedLimits
from edgeinfer.fleet.db import Database
from edgeinfer.fleet.records import Record, Rejected, parse, rejection
from edgeinfer.testing.postgres import Postgres

T0 = 1_760_000_000.0


@pytest.fixture
def make_db(postgres: Postgres) -> Iterator[Callable[..., Database]]:
    if not postgres.running:
        postgres.start()
    made: list[Database] = []

    def make(**kwargs: Any) -> Database:
        config = DatabaseConfig(dsn=postgres.dsn, schema="c_" + uuid.uuid4().hex[:12], **kwargs)
        db = Database(config)
        db.migrate()
        made.append(db)
        return db

    yield make
    for db in made:
        db.close()


def query(postgres: Postgres, text: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(postgres.dsn) as conn:
        return conn.execute(text, args).fetchall()  # type: ignore[arg-type]


def junk(source: str, i: int, size: int = 16 * 1024) -> Any:
    """A distinct junk message of ``size`` bytes under device level ``source``."""
    body = f"{i:08d}".encode() + b"\xff" * (size - 8)
    return rejection(f"fleet/{source}/cam/result", body, Rejected("not JSON"), T0 + i, source)


def test_rejected_is_capped_per_source_and_in_all(make_db: Callable[..., Database],
                                                  postgres: Postgres) -> None:
    db = make_db(rejected=RejectedLimits(per_source=20, max_rows=50, max_sources=5,
                                         payload_bytes=256))
    s = db._config.schema
    # One client: 100 distinct 16 KiB messages (the issue: 5,000 x 64 KiB, kept whole).
    dropped = stored = 0
    for start in range(0, 100, 25):
        done = db.write([], [junk("junk1", i) for i in range(start, start + 25)])
        stored, dropped = stored + done.rejected, dropped + done.rejected_dropped
    assert (stored, dropped) == (20, 80)
    assert query(postgres, f"SELECT count(*), max(length(payload)) FROM {s}.rejected") == [
        (20, 256)]
    [(times, n, size, sample_topic, sample, sample_size)] = query(
        postgres, f"SELECT times, dropped, dropped_bytes, sample_topic, sample, sample_size"
                  f" FROM {s}.rejected_sources WHERE source = 'junk1'")
    assert (times, n, size) == (100, 80, 80 * 16 * 1024)
    assert sample_topic == "fleet/junk1/cam/result" and len(sample) == 256
    assert sample.startswith(b"00000099") and sample_size == 16 * 1024
    # A repeat of a stored message only counts.
    assert db.write([], [junk("junk1", 0)]).rejected == 1
    assert query(postgres, f"SELECT times FROM {s}.rejected WHERE size > 0 ORDER BY received"
                           f" LIMIT 1") == [(2,)]
    # Ten more sources, ten messages each: the total cap holds; sources past 5 count as '*'.
    for k in range(10):
        db.write([], [junk(f"src{k}", i) for i in range(10)])
    assert query(postgres, f"SELECT count(*) FROM {s}.rejected") == [(50,)]
    counted = dict(query(postgres, f"SELECT source, times FROM {s}.rejected_sources"))
    assert len(counted) == 6 and counted["junk1"] == 101
    assert sum(counted.values()) == 201 and counted["*"] == 60
    on_disk = query(postgres, f"SELECT pg_total_relation_size('{s}.rejected')"
                              f" + pg_total_relation_size('{s}.rejected_sources')")[0][0]
    assert on_disk < 512 * 1024  # the old code kept 1.6 MiB of payload here


def test_a_status_over_the_bound_is_stored_summarised(make_db: Callable[..., Database],
                                                      postgres: Postgres) -> None:
    db = make_db(status_max_bytes=4096)
    s = db._config.schema
    big = {"state": "online", "version": "1.2.3", "ts": T0, "pipelines": ["cam"],
           "junk": "x" * 256 * 1024, "more": list(range(3000))}
    fat = parse("fleet/fake1/status", json.dumps(big).encode(), "fleet", T0)
    thin = parse("fleet/cam1/status", json.dumps({"state": "online", "ts": T0}).encode(),
                 "fleet", T0)
    done = db.write([fat, thin])
    assert (done.statuses, done.statuses_truncated) == (2, 1)
    rows = dict(query(postgres, f"SELECT device, status FROM {s}.devices"))
    assert rows["cam1"] == {"state": "online", "ts": T0}
    summary = rows["fake1"]
    assert (summary["state"], summary["version"], summary["pipelines"]) == (
        "online", "1.2.3", ["cam"])
    assert summary["_truncated"]["size"] == len(fat.payload)
    assert summary["_truncated"]["dropped"] == ["junk", "more"]
    assert len(json.dumps(summary)) <= 4096
    size = query(postgres, f"SELECT max(pg_column_size(status)) FROM {s}.devices")[0][0]
    assert size <= 4096


def test_devices_unseen_for_the_retention_period_are_pruned(make_db: Callable[..., Database],
                                                            postgres: Postgres) -> None:
    db = make_db(retention_days=30)
    s = db._config.schema
    now = time.time()

    def status(device: str, received: float) -> Record:
        return Record("status", device, None, "", None, None, received, received,
                      json.dumps({"state": "online", "ts": received}))

    db.write([status(f"fake{i}", now - 40 * 86400) for i in range(20)]
             + [status("cam1", now - 86400), status("cam2", now)])
    done = db.maintain(now)
    assert done["devices_pruned"] == 20
    assert query(postgres, f"SELECT device FROM {s}.devices ORDER BY device") == [
        ("cam1",), ("cam2",)]
