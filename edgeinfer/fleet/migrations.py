"""The fleet database's versioned schema, as ordered SQL (``docs/fleet.md``).

Each migration is applied once, in order, in the transaction that records it in
``schema_migrations``; `edgeinfer.fleet.db.Database.migrate` runs them under an advisory lock so
that collectors starting together do not race. A released migration is never edited: a change
is a new one at the end. ``{s}`` is the configured schema (quoted by the caller).

Tables: ``results`` and ``events`` are partitioned by range of the device's time (``ts``), with
a ``DEFAULT`` partition for rows no period partition holds yet (a device clock far off); their
primary keys end in ``ts`` because PostgreSQL requires the partition key in every unique key.
``devices`` holds each device's newest status. ``results_flat`` is a view for dashboards.
``rejected`` holds the messages that are no row (one per distinct topic and payload), capped
per source and in all; ``rejected_sources`` counts them per source, with a sample of those past
the caps.
"""

from __future__ import annotations

from typing import LiteralString

__all__ = ["MIGRATIONS"]

_V1_TABLES = """
CREATE TABLE {s}.results (
    device text NOT NULL,
    pipeline text NOT NULL,
    run_id text NOT NULL,
    seq bigint NOT NULL,
    ts timestamptz NOT NULL,
    received timestamptz NOT NULL,
    committed timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL,
    PRIMARY KEY (device, pipeline, run_id, seq, ts)
) PARTITION BY RANGE (ts);
CREATE TABLE {s}.results_default PARTITION OF {s}.results DEFAULT;
CREATE INDEX results_ts ON {s}.results USING brin (ts);

CREATE TABLE {s}.events (
    device text NOT NULL,
    pipeline text NOT NULL,
    event_id text NOT NULL,
    run_id text NOT NULL,
    seq bigint,
    ts timestamptz NOT NULL,
    received timestamptz NOT NULL,
    committed timestamptz NOT NULL DEFAULT now(),
    payload jsonb NOT NULL,
    PRIMARY KEY (device, pipeline, event_id, ts)
) PARTITION BY RANGE (ts);
CREATE TABLE {s}.events_default PARTITION OF {s}.events DEFAULT;
CREATE INDEX events_ts ON {s}.events USING brin (ts);

CREATE TABLE {s}.devices (
    device text PRIMARY KEY,
    status jsonb NOT NULL,
    status_ts timestamptz NOT NULL,
    updated timestamptz NOT NULL DEFAULT now()
);
"""

# A device's JSON is untrusted: a field of the wrong type gives NULL, never a failing query.
_V2_VIEW = """
CREATE FUNCTION {s}.json_num(value jsonb) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT CASE WHEN jsonb_typeof(value) = ''number'' THEN value::double precision END';

CREATE FUNCTION {s}.json_array(value jsonb) RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT CASE WHEN jsonb_typeof(value) = ''array'' THEN value END';

CREATE VIEW {s}.results_flat AS
SELECT r.device,
       r.pipeline,
       r.run_id,
       r.seq,
       r.ts,
       r.received,
       r.committed,
       {s}.json_num(r.payload -> 'latency_ms' -> 'pre')
         + {s}.json_num(r.payload -> 'latency_ms' -> 'infer')
         + {s}.json_num(r.payload -> 'latency_ms' -> 'post') AS latency_ms,
       jsonb_array_length({s}.json_array(r.payload -> 'detections')) AS detections,
       coalesce(
         (SELECT d ->> 'label'
            FROM jsonb_array_elements({s}.json_array(r.payload -> 'detections')) AS d
           ORDER BY {s}.json_num(d -> 'score') DESC NULLS LAST
           LIMIT 1),
         {s}.json_array(r.payload -> 'top') -> 0 ->> 'label') AS top_label,
       r.payload -> 'model' ->> 'name' AS model,
       r.payload -> 'model' ->> 'version' AS model_version,
       r.payload ->> 'provider' AS provider,
       extract(epoch FROM r.committed - r.received) AS lag_s
  FROM {s}.results AS r;
"""

# Statuses are ordered by receive time (a device clock far ahead must not win for good);
# rejected messages are parked, once per distinct (topic, payload), with why; json_num gives
# NULL for a number double precision cannot hold instead of failing the whole query.
_V3_REJECTED = """
ALTER TABLE {s}.devices ADD COLUMN status_received timestamptz;

CREATE TABLE {s}.rejected (
    digest bytea PRIMARY KEY,
    topic text NOT NULL,
    reason text NOT NULL,
    payload bytea NOT NULL,
    size integer NOT NULL,
    received timestamptz NOT NULL,
    last_received timestamptz NOT NULL,
    times bigint NOT NULL DEFAULT 1
);
CREATE INDEX rejected_last_received ON {s}.rejected (last_received);

CREATE OR REPLACE FUNCTION {s}.json_num(value jsonb) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS 'SELECT CASE WHEN jsonb_typeof(value) = ''number''
                     AND abs(value::numeric) < 1e308
                     AND (value::numeric = 0 OR abs(value::numeric) > 1e-307)
                    THEN value::double precision END';
"""

# Rejected messages are capped per source (the device level of their topic) and in all: the
# ones past a cap only count here, the latest kept as a sample. Devices are pruned by the
# receive time of their newest status (before migration 3: updated).
_V4_REJECTED_CAPS = """
ALTER TABLE {s}.rejected ADD COLUMN source text NOT NULL DEFAULT '';
CREATE INDEX rejected_source ON {s}.rejected (source);

CREATE TABLE {s}.rejected_sources (
    source text PRIMARY KEY,
    times bigint NOT NULL DEFAULT 0,
    dropped bigint NOT NULL DEFAULT 0,
    dropped_bytes bigint NOT NULL DEFAULT 0,
    first_received timestamptz NOT NULL,
    last_received timestamptz NOT NULL,
    sample_topic text,
    sample_reason text,
    sample bytea,
    sample_size integer
);
CREATE INDEX rejected_sources_last_received ON {s}.rejected_sources (last_received);
CREATE INDEX devices_seen ON {s}.devices ((coalesce(status_received, updated)));
"""

MIGRATIONS: tuple[tuple[int, str, LiteralString], ...] = (
    (1, "tables", _V1_TABLES),
    (2, "results_flat", _V2_VIEW),
    (3, "rejected", _V3_REJECTED),
    (4, "rejected_caps", _V4_REJECTED_CAPS),
)
"""``(version, name, sql)`` in the order they are applied."""
