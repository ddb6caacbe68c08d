"""The fleet database: versioned migrations, idempotent batched writes, time partitions and
retention, on PostgreSQL through psycopg 3 (``edgeinfer[collect]``; imported only here and in
``partitions``).

Idempotence. A result's key is ``(device, pipeline, run_id, seq)`` and an event's
``(device, pipeline, event_id)``; PostgreSQL wants the partition key (``ts``, the device's
time) in every unique key of a partitioned table, so the primary keys end in ``ts``. That
costs nothing for redeliveries: ``ts`` comes from the payload, so a message delivered again
has the same ``ts``, lands in the same partition and is skipped there by
``ON CONFLICT DO NOTHING``. Only a device that sent one key twice with different times would
get two rows, and devices do not.

Partitions and retention: `Database.maintain`, which runs `edgeinfer.fleet.partitions.maintain`
(rows in no period partition wait in the ``DEFAULT`` partition and move when theirs is made).

Writes. One transaction per `Database.write`: results and events by a multi-row
``INSERT ... ON CONFLICT DO NOTHING`` for small batches, and for batches of at least
``copy_from`` rows by COPY into a session temporary table (``ON COMMIT DELETE ROWS``: made
once per connection rather than per batch, so the catalog does not churn) then
``INSERT ... SELECT ... ON CONFLICT DO NOTHING``. Statuses are upserted; the last received
wins (``status_received``, then the device's ``status_ts``); a status longer than
``status_max_bytes`` is stored summarised (`edgeinfer.fleet.records.bounded_status`). Rejected
messages go to ``rejected`` in the same transaction, once per distinct topic and payload
(``times`` counts them), within the caps of `edgeinfer.fleet.rejected`.

Failures. A failure of the database (connection, timeout, serialization) raises
`StorageError`: the same batch can be written again later. A refusal of the data (a value
out of a column's range, a character it cannot store, a value the driver cannot convert)
raises `StorageDataError`: the same rows fail again, so the caller isolates them. So does a
statement over one of the server's limits (class 54, ``program_limit_exceeded``).

Bytes. Every statement is bounded by rows (`_CHUNK`) and by the bytes of its values
(``max_bytes``, ``batch.max_bytes``): a batch of big statuses is written in as many statements
as it takes (one transaction still), never one message near PostgreSQL's 1 GiB limit, where
the server drops the connection (``invalid message length``). A single row over the budget goes
alone. `Database.probe` tells the collector whether a failure was the database's or the
batch's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, LiteralString, TypeVar

from ..config.collect import DatabaseConfig
from ..errors import StorageDataError, StorageError
from .migrations import MIGRATIONS
from .partitions import maintain
from .records import Record, Rejection, bounded_status
from .rejected import park, rejected_rows

if TYPE_CHECKING:
    import psycopg

__all__ = ["Database", "WriteResult"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

_LOCK = 0x45494E46  # "EINF": advisory lock class of migrations and maintenance, per schema
_CHUNK = 250  # rows per multi-row INSERT: longer statements plan slower per row (measured)
_VALUE_OVERHEAD = 16  # bytes a value costs in a Bind message beyond its own (length, format)

# Per table: its columns as written, one row of a multi-row INSERT (ts and received come as
# Unix seconds, the payload as JSON text), and the same conversion from the staging table.
_TABLES: dict[str, tuple[LiteralString, LiteralString, LiteralString]] = {
    "results": ("device, pipeline, run_id, seq, ts, received, payload",
                "(%s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s::jsonb)",
                "device, pipeline, run_id, seq, to_timestamp(ts), to_timestamp(received),"
                " payload::jsonb"),
    "events": ("device, pipeline, event_id, run_id, seq, ts, received, payload",
               "(%s, %s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s), %s::jsonb)",
               "device, pipeline, event_id, run_id, seq, to_timestamp(ts),"
               " to_timestamp(received), payload::jsonb"),
}
_STAGING: LiteralString = """
CREATE TEMP TABLE IF NOT EXISTS ei_results_in (
    device text, pipeline text, run_id text, seq bigint, ts float8, received float8,
    payload text) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS ei_events_in (
    device text, pipeline text, event_id text, run_id text, seq bigint, ts float8,
    received float8, payload text) ON COMMIT DELETE ROWS;
"""


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What one `Database.write` did.

    Attributes:
        results: Result rows inserted.
        events: Event rows inserted.
        statuses: Device statuses inserted or replaced by a newer one.
        duplicates: Rows skipped: results and events already present (or twice in the
            batch), and statuses no newer than the stored one.
        rejected: Rejected messages parked (or counted again) in ``rejected``.
        rejected_dropped: Rejected messages past a cap of ``rejected``: counted in
            ``rejected_sources``, not stored.
        statuses_truncated: Statuses over ``status_max_bytes``, stored summarised.
    """

    results: int
    events: int
    statuses: int
    duplicates: int
    rejected: int = 0
    rejected_dropped: int = 0
    statuses_truncated: int = 0


class Database:
    """The collector's connection to PostgreSQL. Not thread-safe: one thread (the collector's
    writer) calls `write` and `maintain`, between batches.

    Args:
        config: Where and how (``database:`` of ``collect.yaml``).
        copy_from: Batches of at least this many results and events are written through COPY
            (``batch.copy_from`` of ``collect.yaml``).
        max_bytes: Bytes of values in one statement (``batch.max_bytes``): more rows are
            written in several statements.
    """

    def __init__(self, config: DatabaseConfig, *, copy_from: int = 500,
                 max_bytes: int = 32 * 2**20) -> None:
        self._config = config
        self._copy_from = copy_from
        self._max_bytes = max_bytes
        self._conn: psycopg.Connection[Any] | None = None

    def connect(self) -> None:
        """Connect, unless connected already.

        Raises:
            StorageError: PostgreSQL cannot be reached or refuses the login; a later call
                tries again.
        """
        if self._conn is not None and not self._conn.closed:
            return
        import psycopg

        conn = None
        try:
            conn = psycopg.connect(
                self._config.dsn, password=self._config.password, autocommit=True,
                connect_timeout=max(2, math.ceil(self._config.connect_timeout_s)),
                application_name="edgeinfer-collect")
            conn.execute(_STAGING)
        except psycopg.Error as exc:
            if conn is not None:
                conn.close()
            # from None: the driver's text could quote the connection string
            raise StorageError(self._scrub(
                f"cannot connect to PostgreSQL at {self._where()}: {exc}")) from None
        self._conn = conn
        log.info("connected to PostgreSQL at %s", self._where())

    def probe(self) -> None:
        """Whether the database answers: connect (again, after a failure) and run
        ``SELECT 1``.

        Raises:
            StorageError: it does not; the database, not a batch, is failing.
        """
        self._transaction("probe", lambda conn: conn.execute("SELECT 1").fetchone())

    def migrate(self) -> list[int]:
        """Apply the migrations this database lacks, in one transaction under an advisory
        lock (collectors starting together wait for each other, then find nothing to do).

        Returns:
            The versions applied by this call (empty when the schema was current).

        Raises:
            StorageError: a database failure; nothing was applied.
        """
        from psycopg import sql

        def apply(conn: psycopg.Connection[Any]) -> list[int]:
            s = sql.Identifier(self._config.schema)
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                         (_LOCK, self._config.schema))
            conn.execute(sql.SQL(
                "CREATE SCHEMA IF NOT EXISTS {s};"
                " CREATE TABLE IF NOT EXISTS {s}.schema_migrations (version integer PRIMARY KEY,"
                " name text NOT NULL, applied timestamptz NOT NULL DEFAULT now())").format(s=s))
            done = {row[0] for row in conn.execute(
                sql.SQL("SELECT version FROM {s}.schema_migrations").format(s=s))}
            applied = []
            for version, name, text in MIGRATIONS:
                if version not in done:
                    conn.execute(sql.SQL(text).format(s=s))
                    conn.execute(sql.SQL("INSERT INTO {s}.schema_migrations (version, name)"
                                         " VALUES (%s, %s)").format(s=s), (version, name))
                    applied.append(version)
            return applied

        applied = self._transaction("migrate", apply)
        if applied:
            log.info("schema %s migrated to version %d", self._config.schema, applied[-1])
        return applied

    def write(self, records: Sequence[Record],
              rejected: Sequence[Rejection] = ()) -> WriteResult:
        """Write a batch (and park the rejected messages) in one transaction, committed when
        this returns.

        Writing the same records again (a redelivery after a lost commit reply) inserts
        nothing twice: they count as duplicates.

        Raises:
            StorageDataError: the database (or the driver) refused a value of these records;
                nothing was committed, and writing them again fails the same way.
            StorageError: any other database failure; nothing of the batch was committed (or,
                if the connection died during COMMIT, all of it may have been: writing the
                batch again is safe). The next call reconnects.
        """
        if not records and not rejected:
            return WriteResult(0, 0, 0, 0)
        results = [(r.device, r.pipeline, r.run_id, r.seq, r.ts, r.received, r.payload)
                   for r in records if r.kind == "result"]
        events = [(r.device, r.pipeline, r.event_id, r.run_id, r.seq, r.ts, r.received,
                   r.payload) for r in records if r.kind == "event"]
        newest: dict[str, Record] = {}
        for r in records:
            if r.kind == "status" and (r.device not in newest or (
                    newest[r.device].received, newest[r.device].ts) <= (r.received, r.ts)):
                newest[r.device] = r
        limit = self._config.status_max_bytes
        bounded = {d: bounded_status(r.payload, limit) for d, r in newest.items()}
        statuses = [(r.device, bounded[r.device] or r.payload, r.ts, r.received)
                    for r in newest.values()]
        truncated = sum(text is not None for text in bounded.values())
        copy = len(results) + len(events) >= self._copy_from
        parked = rejected_rows(rejected, self._config.rejected.payload_bytes)

        def batch(conn: psycopg.Connection[Any]) -> WriteResult:
            n_results = self._rows(conn, "results", results, copy)
            n_events = self._rows(conn, "events", events, copy)
            n_statuses = self._statuses(conn, statuses)
            n_rejected, n_dropped = self._rejected(conn, parked)
            skipped = len(results) - n_results + len(events) - n_events
            skipped += sum(r.kind == "status" for r in records) - n_statuses
            return WriteResult(n_results, n_events, n_statuses, skipped, n_rejected,
                               n_dropped, truncated)

        return self._transaction("write", batch)

    def maintain(self, now: float) -> dict[str, Any]:
        """Make the partitions of the period holding ``now`` and of the next one (moving rows
        of those periods out of the default partition), drop partitions wholly older than
        ``retention_days`` and delete older rows of the default partitions.

        Args:
            now: The time to maintain for (Unix s).

        Returns:
            ``{"created": [table names], "moved": rows, "dropped": [table names],
            "deleted": rows, "devices_pruned": devices}``.

        Raises:
            StorageError: a database failure; nothing was changed.
        """
        def run(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                         (_LOCK, self._config.schema))
            return maintain(conn, self._config, now)

        done = self._transaction("maintain", run)
        if done["created"] or done["dropped"]:
            log.info("partitions created %s, dropped %s", done["created"], done["dropped"])
        return done

    def close(self) -> None:
        """Close the connection (a later call connects again)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _rows(self, conn: psycopg.Connection[Any], table: LiteralString,
              rows: list[tuple[Any, ...]], copy: bool) -> int:
        if not rows:
            return 0
        from psycopg import sql

        cols, values, staged = _TABLES[table]
        target = sql.Identifier(self._config.schema, table)
        with conn.cursor() as cur:
            if copy:
                staging = sql.Identifier(f"ei_{table}_in")
                with cur.copy(sql.SQL("COPY {} FROM STDIN").format(staging)) as pipe:
                    for row in rows:
                        pipe.write_row(row)
                cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}"
                                    " ON CONFLICT DO NOTHING").format(
                    target, sql.SQL(cols), sql.SQL(staged), staging))
                return max(cur.rowcount, 0)
            inserted = 0
            for chunk in _chunks(rows, self._max_bytes):
                cur.execute(sql.SQL("INSERT INTO {} ({}) VALUES {} ON CONFLICT DO NOTHING").format(
                    target, sql.SQL(cols), sql.SQL(", ").join([sql.SQL(values)] * len(chunk))),
                    [value for row in chunk for value in row])
                inserted += max(cur.rowcount, 0)
            return inserted

    def _statuses(self, conn: psycopg.Connection[Any],
                  statuses: list[tuple[str, str, float, float]]) -> int:
        # Receive time orders them (a row of before migration 3 has none: any status is newer).
        return self._upsert(
            conn, "devices", "(%s, %s::jsonb, to_timestamp(%s), to_timestamp(%s))", statuses,
            "INSERT INTO {t} AS d (device, status, status_ts, status_received) VALUES {v}"
            " ON CONFLICT (device) DO UPDATE SET status = EXCLUDED.status,"
            " status_ts = EXCLUDED.status_ts, status_received = EXCLUDED.status_received,"
            " updated = now()"
            " WHERE d.status_received IS NULL OR (d.status_received, d.status_ts)"
            " < (EXCLUDED.status_received, EXCLUDED.status_ts)")

    def _rejected(self, conn: psycopg.Connection[Any],
                  rows: list[tuple[Any, ...]]) -> tuple[int, int]:
        """Park rejected ``rows`` within ``database.rejected`` (`edgeinfer.fleet.rejected`)."""
        return park(conn, self._config.schema, self._config.rejected, rows, self._upsert)

    def _upsert(self, conn: psycopg.Connection[Any], table: str, row: str,
                rows: Sequence[tuple[Any, ...]], statement: str) -> int:
        """One multi-row ``statement`` (``{t}``: ``table`` in our schema, ``{v}``: ``row`` once
        per row) over ``rows``; returns the rows it inserted or updated."""
        if not rows:
            return 0
        from psycopg import sql

        done = 0
        with conn.cursor() as cur:
            for chunk in _chunks(rows, self._max_bytes):
                values = sql.SQL(", ").join([sql.SQL(row)] * len(chunk))
                cur.execute(sql.SQL(statement).format(
                    t=sql.Identifier(self._config.schema, table), v=values),
                    [value for r in chunk for value in r])
                done += max(cur.rowcount, 0)
        return done

    def _transaction(self, what: str, body: Callable[[psycopg.Connection[Any]], _T]) -> _T:
        import psycopg

        self.connect()
        conn = self._conn
        assert conn is not None
        try:
            with conn.transaction():
                return body(conn)
        except (psycopg.DataError, psycopg.IntegrityError, psycopg.errors.ProgramLimitExceeded,
                ValueError, TypeError, OverflowError) as exc:
            # The data's fault, not the connection's: the same rows would fail again.
            raise StorageDataError(self._scrub(
                f"PostgreSQL {what} refused the data: {type(exc).__name__}: {exc}")) from exc
        except psycopg.Error as exc:
            self._drop()
            raise StorageError(self._scrub(
                f"PostgreSQL {what} failed at {self._where()}: "
                f"{type(exc).__name__}: {exc}")) from exc

    def _drop(self) -> None:
        # After a failure the connection may be dead or mid-protocol: start clean next time.
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # a broken connection may fail to close; it is gone either way
                log.debug("closing a failed connection", exc_info=True)

    def _where(self) -> str:
        from psycopg.conninfo import conninfo_to_dict

        try:
            info = conninfo_to_dict(self._config.dsn)
        except Exception:  # an unparsable dsn is reported by connect() itself
            return "the configured dsn"
        return f"{info.get('host', 'localhost')}:{info.get('port', 5432)}/{info.get('dbname', '')}"

    def _scrub(self, text: str) -> str:
        secrets = [self._config.password]
        try:
            from psycopg.conninfo import conninfo_to_dict

            secrets.append(str(conninfo_to_dict(self._config.dsn).get("password") or ""))
        except Exception:  # nothing to scrub from what cannot be parsed
            pass
        for secret in secrets:
            if secret:
                text = text.replace(secret, "***")
        return text


def _chunks(rows: Sequence[tuple[Any, ...]],
            max_bytes: int) -> Iterator[Sequence[tuple[Any, ...]]]:
    """``rows`` in runs of at most `_CHUNK` rows and ``max_bytes`` of values (a row over it
    alone): one statement each."""
    start, size = 0, 0
    for i, row in enumerate(rows):
        cost = _row_bytes(row)
        if i > start and (i - start >= _CHUNK or size + cost > max_bytes):
            yield rows[start:i]
            start, size = i, 0
        size += cost
    if start < len(rows):
        yield rows[start:]


def _row_bytes(row: Sequence[Any]) -> int:
    """What a row's values cost in a statement, at most (a non-ASCII character up to 4 bytes)."""
    size = 0
    for value in row:
        if isinstance(value, str):
            size += len(value) if value.isascii() else 4 * len(value)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            size += len(value)
        size += _VALUE_OVERHEAD
    return size
