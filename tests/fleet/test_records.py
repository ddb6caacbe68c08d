"""edgeinfer.fleet.records: device messages parsed as untrusted input, and every message it
accepts is one PostgreSQL can store (a message that fails its batch would fail it forever)."""

from __future__ import annotations

import json
import random
import uuid

import psycopg
import pytest

from edgeinfer.config.collect import DatabaseConfig
from edgeinfer.fleet.db import Database
from edgeinfer.fleet.records import MAX_CLOCK_SKEW_S, MAX_PAYLOAD, Record, Rejected, parse
from edgeinfer.testing.postgres import Postgres

NOW = 1_760_000_000.0


def doc(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def test_result_event_and_status() -> None:
    r = parse("ei/cam-1/door/result", doc(seq=7, run_id="abc", ts=NOW - 1, x=1), "ei", NOW)
    assert (r.kind, r.device, r.pipeline, r.run_id, r.seq, r.ts, r.received) == \
        ("result", "cam-1", "door", "abc", 7, NOW - 1, NOW)
    assert json.loads(r.payload)["x"] == 1
    e = parse("ei/cam-1/door/event", doc(event_id="e-1", start=NOW - 5, seq=3), "ei", NOW)
    assert (e.kind, e.event_id, e.run_id, e.seq, e.ts) == ("event", "e-1", "", 3, NOW - 5)
    s = parse("ei/cam-1/status", doc(state="online", ts=NOW - 2), "ei", NOW)
    assert (s.kind, s.device, s.pipeline, s.ts) == ("status", "cam-1", None, NOW - 2)


def test_a_result_from_an_older_device_has_an_empty_run_id() -> None:
    assert parse("ei/d/p/result", doc(seq=0, ts=NOW), "ei", NOW).run_id == ""


@pytest.mark.parametrize("ts", [None, "yesterday", True, -1, 0, float("inf"), 5e12, [1]])
def test_an_implausible_time_is_the_receive_time(ts: object) -> None:
    payload = json.dumps({"seq": 1, "ts": ts}).replace("Infinity", "1e999")
    if ts == float("inf"):
        with pytest.raises(Rejected):  # 1e999: not a number PostgreSQL or Python keeps
            parse("ei/d/p/result", payload.encode(), "ei", NOW)
        return
    assert parse("ei/d/p/result", payload.encode(), "ei", NOW).ts == NOW


@pytest.mark.parametrize("topic", [
    "other/d/p/result", "ei", "ei/", "ei/d/result", "ei/d/p/q/result", "ei/d/p/stats",
    "ei//p/result", "ei/d//result", "ei/" + "d" * 65 + "/p/result", "ei/d\x00/p/result",
    "ei/d\u202e/p/result", "ei/d/p/event/extra", "eix/d/p/result",
])
def test_rejected_topics(topic: str) -> None:
    with pytest.raises(Rejected):
        parse(topic, doc(seq=1, event_id="e"), "ei", NOW)


@pytest.mark.parametrize("payload", [
    b"", b"not json", b"\xff\xfe", b"[]", b"1", b'"x"', b"null",
    b'{"seq": -1}', b'{"seq": 1.5}', b'{"seq": true}', b'{"seq": "1"}', b'{"seq": 9223372036854775808}',
    b'{"seq": 1, "run_id": 5}', b'{"seq": 1, "run_id": "' + b"r" * 129 + b'"}',
    b'{"seq": 1, "run_id": "a\\nb"}', b"{}",
    # what PostgreSQL's jsonb refuses: it would fail the whole batch on every retry
    b'{"seq": 1, "x": NaN}', b'{"seq": 1, "x": -Infinity}', b'{"seq": 1, "x": 1e400}',
    b'{"seq": 1, "x": "\\u0000"}', b'{"seq": 1, "\\u0000": 1}', b'{"seq": 1, "x": ["\\udc00"]}',
    b'{"seq": 1, "x": "\\ud83d"}', b"[" * 100_000 + b"]" * 100_000,
    # numbers numeric refuses (its exponent), or double precision cannot hold (the view's
    # cast fails on them), and a ts that made parse itself raise OverflowError
    b'{"seq": 1, "ts": 1' + b"0" * 399 + b"}", b'{"seq": 1, "x": 1e-20000}',
    b'{"seq": 1, "x": 0e-20000}', b'{"seq": 1, "x": 1e-400}', b'{"seq": 1, "x": -1E-330}',
    b'{"seq": 1, "x": 1' + b"0" * 400 + b"}", b'{"seq": 1, "x": 1.' + b"0" * 200 + b"}",
], ids=lambda p: repr(p[:40]))
def test_rejected_results(payload: bytes) -> None:
    with pytest.raises(Rejected):
        parse("ei/d/p/result", payload, "ei", NOW)


def test_a_status_from_a_clock_far_ahead_is_bounded_to_the_skew_window() -> None:
    s = parse("ei/d/status", doc(ts=4_102_444_799), "ei", NOW)
    assert s.ts == NOW + MAX_CLOCK_SKEW_S and s.received == NOW
    assert parse("ei/d/status", doc(ts=NOW + 5), "ei", NOW).ts == NOW + 5


@pytest.mark.parametrize("payload", [
    b'{"event_id": ""}', b'{"event_id": 1}', b'{}', b'{"event_id": "e", "seq": -3}',
    b'{"event_id": "' + b"e" * 129 + b'"}', b'{"event_id": "e\\u0007"}',
])
def test_rejected_events(payload: bytes) -> None:
    with pytest.raises(Rejected):
        parse("ei/d/p/event", payload, "ei", NOW)


def test_oversized_payload_is_rejected_before_parsing() -> None:
    big = b'{"seq": 1, "x": "' + b"a" * MAX_PAYLOAD + b'"}'
    with pytest.raises(Rejected, match="bytes is over"):
        parse("ei/d/p/result", big, "ei", NOW)


def test_escapes_that_are_storable_are_kept() -> None:
    text = b'{"seq": 1, "a": "\\\\u0000", "b": "\\ud83d\\ude00", "c": "tab\\there"}'
    r = parse("ei/d/p/result", text, "ei", NOW)
    assert json.loads(r.payload)["b"] == "\U0001F600"


def hostile_payloads(rng: random.Random) -> list[bytes]:
    pieces = ['"\\u0000"', '"\\ud800"', '"\\\\u0000"', "NaN", "1e308", "1e-400", "-0",
              '"\\ud83d\\ude00"', '"\\u2028"', "123456789012345678901234567890", '"é"',
              "[]", "{}", "null", "true", '"\\"\\\\\\/\\b\\f\\n\\r\\t"', '"\t"', "1E+2",
              "1e-20000", "0e-20000", "1" + "0" * 400, "-2.5e-310", "4.9e-324", "1.7e308"]
    out = []
    for _ in range(400):
        fields = ", ".join(f'"k{i}": {rng.choice(pieces)}' for i in range(rng.randint(0, 4)))
        key = rng.choice([f'"seq": {rng.randint(0, 2**63 - 1)}', '"seq": -1', '"seq": 1.0'])
        out.append(("{" + key + (", " + fields if fields else "") + "}").encode())
    out.append(b'{"seq": 1, "deep": ' + b"[" * 900 + b"]" * 900 + b"}")
    return out


def test_every_accepted_message_is_storable(postgres: Postgres) -> None:
    if not postgres.running:
        postgres.start()
    rng = random.Random(17)
    accepted: list[Record] = []
    for payload in hostile_payloads(rng):
        try:
            accepted.append(parse("ei/d/p/result", payload, "ei", NOW))
        except Rejected:
            pass
    assert 50 < len(accepted) < 400  # both sides of the line were exercised
    config = DatabaseConfig(dsn=postgres.dsn, schema="t_" + uuid.uuid4().hex[:12])
    for copy_from in (1, 100_000):  # both write paths
        db = Database(config, copy_from=copy_from)
        try:
            db.migrate()
            db.write(accepted)
        finally:
            db.close()
    # and every number in them is one a dashboard can cast (the results_flat view does)
    with psycopg.connect(postgres.dsn) as conn:
        conn.execute(f"SELECT count(v::float8) FROM {config.schema}.results,"
                     " jsonb_each(payload) AS e(k, v) WHERE jsonb_typeof(v) = 'number'")
