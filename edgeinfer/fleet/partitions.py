"""Time partitions of the fleet database's ``results`` and ``events`` tables, and retention
(``docs/fleet.md``): what `edgeinfer.fleet.db.Database.maintain` runs, in its transaction and
under its advisory lock.

`maintain` makes the partitions of the current and the next period (``day`` or ``month``,
UTC). A row whose ``ts`` falls in no period partition (a device clock far off, or a write before
``maintain`` ran) goes to the ``DEFAULT`` partition. When ``maintain`` later makes the partition
of such a period, it moves that period's rows out of the default partition into the new one in
the same transaction, so a key never lives in two partitions and redeliveries stay duplicates.
Partitions wholly older than ``retention_days`` are dropped, and default-partition rows older
than it deleted; so are parked rejected messages, their per-source counts, and devices whose
newest status is older.

Retention runs on the receive time: a device whose clock is far behind does not have its rows
deleted as soon as they arrive.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING, Any

from ..config.collect import DatabaseConfig

if TYPE_CHECKING:
    import psycopg

__all__ = ["PARTITIONED", "maintain"]

PARTITIONED = ("results", "events")  # the tables partitioned by range of ``ts``
_UTC = dt.UTC


def maintain(conn: psycopg.Connection[Any], config: DatabaseConfig, now: float) -> dict[str, Any]:
    """Make the partitions of the period holding ``now`` and of the next one, drop or empty
    those past retention; returns what `edgeinfer.fleet.db.Database.maintain` returns."""
    done: dict[str, Any] = {"created": [], "moved": 0, "dropped": [], "deleted": 0,
                            "devices_pruned": 0}
    current = _period_start(dt.datetime.fromtimestamp(now, _UTC), config.partition)
    nxt = _period_after(current, config.partition)
    cutoff = (dt.datetime.fromtimestamp(now, _UTC) - dt.timedelta(days=config.retention_days)
              if config.retention_days is not None else None)
    for table in PARTITIONED:
        for lo in (current, nxt):
            moved = _make_partition(conn, config.schema, table, lo,
                                    _period_after(lo, config.partition), config.partition)
            if moved is not None:
                done["created"].append(_partition_name(table, lo, config.partition))
                done["moved"] += moved
        if cutoff is not None:
            dropped, deleted = _drop_older(conn, config.schema, table, cutoff)
            done["dropped"] += dropped
            done["deleted"] += deleted + _delete_received(
                conn, config.schema, f"{table}_default", "received", cutoff)
    if cutoff is not None:
        done["deleted"] += _delete_received(conn, config.schema, "rejected",
                                            "last_received", cutoff)
        _delete_received(conn, config.schema, "rejected_sources", "last_received", cutoff)
        done["devices_pruned"] = _prune_devices(conn, config.schema, cutoff)
    return done


def _prune_devices(conn: psycopg.Connection[Any], schema: str, cutoff: dt.datetime) -> int:
    """Delete the devices whose newest status was received before ``cutoff`` (a device that
    comes back announces itself again with its retained status)."""
    from psycopg import sql

    cur = conn.execute(sql.SQL("DELETE FROM {} WHERE coalesce(status_received, updated) < %s")
                       .format(sql.Identifier(schema, "devices")), (cutoff,))
    return max(cur.rowcount, 0)


def _make_partition(conn: psycopg.Connection[Any], schema: str, table: str, lo: dt.datetime,
                    hi: dt.datetime, partition: str) -> int | None:
    """Make one period's partition unless it exists; returns the rows moved into it out of
    the default partition (``None``: it existed)."""
    from psycopg import sql

    name = _partition_name(table, lo, partition)
    exists = conn.execute("SELECT to_regclass(%s)",
                          (sql.Identifier(schema, name).as_string(conn),)).fetchone()
    if exists is None or exists[0] is not None:
        return None
    new, parent = sql.Identifier(schema, name), sql.Identifier(schema, table)
    default = sql.Identifier(schema, f"{table}_default")
    # ATTACH refuses a range the default partition holds rows of: move them first.
    conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS)").format(new, parent))
    cur = conn.execute(sql.SQL(
        "WITH moved AS (DELETE FROM {d} WHERE ts >= %s AND ts < %s RETURNING *)"
        " INSERT INTO {n} SELECT * FROM moved").format(d=default, n=new), (lo, hi))
    moved = max(cur.rowcount, 0)
    conn.execute(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
        parent, new, sql.Literal(lo), sql.Literal(hi)))
    return moved


def _drop_older(conn: psycopg.Connection[Any], schema: str, table: str,
                cutoff: dt.datetime) -> tuple[list[str], int]:
    """Drop the partitions wholly older than ``cutoff`` by device time whose rows were all
    received before it too; in the others (a device clock far behind) delete only the rows
    received before it. Returns the partitions dropped and the rows deleted."""
    from psycopg import sql

    dropped, deleted = [], 0
    children = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass",
        (sql.Identifier(schema, table).as_string(conn),)).fetchall()
    for (name,) in children:
        match = re.fullmatch(re.escape(table) + r"_p(\d{8}|\d{6})", name)
        if match is None:
            continue  # the default partition, or one someone else made
        stamp = match.group(1)
        lo = dt.datetime.strptime(stamp, "%Y%m%d" if len(stamp) == 8 else "%Y%m").replace(
            tzinfo=_UTC)
        if _period_after(lo, "day" if len(stamp) == 8 else "month") > cutoff:
            continue
        recent = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE received >= %s)")
                              .format(sql.Identifier(schema, name)), (cutoff,)).fetchone()
        if recent is not None and recent[0]:
            deleted += _delete_received(conn, schema, name, "received", cutoff)
        else:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, name)))
            dropped.append(name)
    return dropped, deleted


def _delete_received(conn: psycopg.Connection[Any], schema: str, table: str, column: str,
                     cutoff: dt.datetime) -> int:
    from psycopg import sql

    cur = conn.execute(sql.SQL("DELETE FROM {} WHERE {} < %s").format(
        sql.Identifier(schema, table), sql.Identifier(column)), (cutoff,))
    return max(cur.rowcount, 0)


def _period_start(moment: dt.datetime, partition: str) -> dt.datetime:
    start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return start.replace(day=1) if partition == "month" else start


def _period_after(start: dt.datetime, partition: str) -> dt.datetime:
    if partition == "day":
        return start + dt.timedelta(days=1)
    return (start.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


def _partition_name(table: str, start: dt.datetime, partition: str) -> str:
    return f"{table}_p{start:%Y%m%d}" if partition == "day" else f"{table}_p{start:%Y%m}"
