"""The caps of the ``rejected`` table (``database.rejected`` of ``collect.yaml``,
``docs/fleet.md``): what one client publishing junk may add to the disk.

A rejected message's *source* is the device level of its topic (`records.source_of`: MQTT does
not tell a subscriber who published). A message is stored in ``rejected`` once per distinct
topic and payload (a repeat only counts), its payload cut to ``payload_bytes``, while its source
has fewer than ``per_source`` rows and the table fewer than ``max_rows``; past a cap it is only
counted in ``rejected_sources`` (``times``, ``dropped``, ``dropped_bytes``) with the latest one
as a sample. ``rejected_sources`` counts at most ``max_sources`` sources one by one, the rest as
``*``. Collectors take turns here (an advisory lock per schema), so the caps hold with several.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..config.collect import RejectedLimits
from .records import Rejection

if TYPE_CHECKING:
    import psycopg

__all__ = ["park", "rejected_rows"]

_LOCK = 0x45494E47  # "EING": the rejected table's caps, per schema (db's migrations use EINF)

Upsert = Callable[["psycopg.Connection[Any]", str, str, Sequence[tuple[Any, ...]], str], int]


def park(conn: psycopg.Connection[Any], schema: str, limits: RejectedLimits,
         rows: list[tuple[Any, ...]], upsert: Upsert) -> tuple[int, int]:
    """Park ``rows`` (`rejected_rows`) within ``limits``, in the caller's transaction;
    returns the rows inserted or counted again, and the messages past a cap (only counted
    per source). ``upsert`` is `edgeinfer.fleet.db.Database`'s multi-row statement."""
    if not rows:
        return 0, 0
    from psycopg import sql

    table = sql.Identifier(schema, "rejected")
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK, schema))
    known = {bytes(d) for (d,) in conn.execute(sql.SQL(
        "SELECT digest FROM {} WHERE digest = ANY(%s)").format(table), ([r[0] for r in rows],))}
    have: dict[str, int] = dict(conn.execute(sql.SQL(
        "SELECT source, count(*) FROM {} WHERE source = ANY(%s) GROUP BY source").format(table),
        (sorted({r[1] for r in rows}),)).fetchall())
    total_row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    total = int(total_row[0]) if total_row is not None else 0
    keep, past = [], []
    for r in rows:
        if r[0] in known:
            keep.append(r)  # a repeat only counts: the row is there already
        elif have.get(r[1], 0) < limits.per_source and total < limits.max_rows:
            keep.append(r)
            have[r[1]] = have.get(r[1], 0) + 1
            total += 1
        else:
            past.append(r)
    stored = upsert(
        conn, "rejected", "(%s, %s, %s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s)",
        keep,
        "INSERT INTO {t} AS r (digest, source, topic, reason, payload, size, received,"
        " last_received, times) VALUES {v} ON CONFLICT (digest) DO UPDATE"
        " SET times = r.times + EXCLUDED.times, reason = EXCLUDED.reason,"
        " last_received = greatest(r.last_received, EXCLUDED.last_received)")
    _count_sources(conn, schema, limits.max_sources, rows, past, upsert)
    return stored, sum(r[8] for r in past)


def _count_sources(conn: psycopg.Connection[Any], schema: str, max_sources: int,
                   rows: list[tuple[Any, ...]], past: list[tuple[Any, ...]],
                   upsert: Upsert) -> None:
    """Count every rejected message per source in ``rejected_sources``, the ones past a
    cap as dropped (the latest as the sample); sources past ``max_sources`` count as
    ``*``."""
    from psycopg import sql

    table = sql.Identifier(schema, "rejected_sources")
    sources = sorted({r[1] for r in rows})
    listed = {s for (s,) in conn.execute(sql.SQL(
        "SELECT source FROM {} WHERE source = ANY(%s)").format(table), (sources,))}
    count_row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
    room = max_sources - (int(count_row[0]) if count_row else 0)
    name: dict[str, str] = {}
    for source in sources:
        if source in listed or source == "*":
            name[source] = source
        elif room > 0:
            name[source], room = source, room - 1
        else:
            name[source] = "*"
    # source -> [times, dropped, dropped bytes, first, last, sample row]
    agg: dict[str, list[Any]] = {}
    dropped = {id(r) for r in past}
    for r in rows:
        entry = agg.setdefault(name[r[1]], [0, 0, 0, r[6], r[6], None])
        entry[0] += r[8]
        entry[3], entry[4] = min(entry[3], r[6]), max(entry[4], r[6])
        if id(r) in dropped:
            entry[1] += r[8]
            entry[2] += r[5] * r[8]
            if entry[5] is None or entry[5][6] <= r[6]:
                entry[5] = r
    values = [(source, times, n, size, first, last,
               *((sample[2], sample[3], sample[4], sample[5]) if sample is not None
                 else (None, None, None, None)))
              for source, (times, n, size, first, last, sample) in agg.items()]
    upsert(
        conn, "rejected_sources",
        "(%s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s, %s, %s, %s)", values,
        "INSERT INTO {t} AS s (source, times, dropped, dropped_bytes, first_received,"
        " last_received, sample_topic, sample_reason, sample, sample_size) VALUES {v}"
        " ON CONFLICT (source) DO UPDATE SET times = s.times + EXCLUDED.times,"
        " dropped = s.dropped + EXCLUDED.dropped,"
        " dropped_bytes = s.dropped_bytes + EXCLUDED.dropped_bytes,"
        " last_received = greatest(s.last_received, EXCLUDED.last_received),"
        " sample_topic = coalesce(EXCLUDED.sample_topic, s.sample_topic),"
        " sample_reason = coalesce(EXCLUDED.sample_reason, s.sample_reason),"
        " sample = coalesce(EXCLUDED.sample, s.sample),"
        " sample_size = coalesce(EXCLUDED.sample_size, s.sample_size)")


def rejected_rows(rejected: Sequence[Rejection], keep: int) -> list[tuple[Any, ...]]:
    """One row per distinct (topic, payload kept): ``(digest, source, topic, reason, payload
    cut to keep bytes, size, received, times)``; a message twice in a batch is one row
    (``times`` 2), as ON CONFLICT DO UPDATE may not touch a row twice in one statement."""
    rows: dict[bytes, tuple[Any, ...]] = {}
    for r in rejected:
        digest = hashlib.sha256(r.topic.encode("utf-8", "replace") + b"\0" + r.payload).digest()
        times = rows[digest][8] + 1 if digest in rows else 1
        rows[digest] = (digest, r.source, r.topic, r.reason, r.payload[:keep], r.size,
                        r.received, r.received, times)
    return list(rows.values())
