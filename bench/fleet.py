"""Fleet collector benchmark (issue 17): simulated devices -> mosquitto -> ``edgeinfer collect`` ->
PostgreSQL, all on this machine.

    python3 bench/fleet.py [--seconds 30] [--devices 200] [--rate 2000] [--quick] [--json]
                           [--no-write]

1. Load: ``--devices`` simulated devices (paho clients, QoS 1, each its own connection, split
   over two publisher processes) publish ``--rate`` results/s in total, ~560-byte payloads made
   like a real detector's results, for ``--seconds``; one ``edgeinfer collect`` (mqtt source,
   the defaults of collect.yaml) writes them into a throwaway PostgreSQL. Measured: the rate
   committed while the load ran, the backlog when it ended, the lag from the device's ``ts`` to
   the commit (from the database's ``committed`` column: the commit's transaction start, so
   slightly under the truth; and the collector's own p50/p99 from its /metrics), the collector's
   CPU per result (psutil, its process) and that every (device, pipeline, run_id, seq) published
   is in the database exactly once.
2. The same load with two collectors in the same group (shared subscription).
3. The write path (``Database.write``, one transaction per batch: COPY into a temp table then
   INSERT ... ON CONFLICT DO NOTHING at ``copy_from`` rows and more, a multi-row INSERT below)
   against a raw COPY of the same rows into an identical table, alternating, medians; batches of
   ``batch.max_rows`` (2000) and of 400 (what the load fills in ``max_age_s``: under
   ``copy_from``, so a multi-row INSERT; and again with ``copy_from`` 1, through COPY).

``--json`` prints one document; without ``--no-write`` the fleet section of docs/benchmarks.md
is replaced.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PREFIX = "bench"
PIPELINE = "cam"

# A mosquitto set up for a fleet (docs/fleet.md): queues far above a collector's outage, sessions
# kept a week, packets up to 1 MiB. The harness already sets max_queued_messages 1000000.
BROKER_CONFIG = "persistent_client_expiration 7d\nmax_packet_size 1048576\n"

# One publisher process: its share of the devices, paced together from one loop.
_PUBLISHER = r"""
import json, sys, threading, time
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
port, prefix, first, count, rate, seconds, run_id, template = (
    int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]),
    float(sys.argv[6]), sys.argv[7], json.loads(sys.argv[8]))
clients = []
for i in range(first, first + count):
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-dev{i:04d}-{run_id[:6]}",
                    protocol=mqtt.MQTTv5)
    c.max_queued_messages_set(0)
    c.connect("127.0.0.1", port)
    c.loop_start()
    clients.append((f"dev{i:04d}", c))
time.sleep(1.0)
seqs = [0] * count
infos = []
interval = 1.0 / rate
start = time.monotonic()
k = 0
while True:
    due = start + k * interval
    if due - start >= seconds:
        break
    wait = due - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    j = k % count
    device, client = clients[j]
    body = dict(template, seq=seqs[j], run_id=run_id, ts=round(time.time(), 6))
    body["frame"] = dict(template["frame"], index=seqs[j], ts=body["ts"])
    infos.append(client.publish(f"{prefix}/{device}/cam/result", json.dumps(body), qos=1))
    seqs[j] += 1
    k += 1
elapsed = time.monotonic() - start
for info in infos:
    info.wait_for_publish(60)
for _, c in clients:  # disconnect first: it wakes each network thread, loop_stop then joins
    c.disconnect()
for _, c in clients:
    c.loop_stop()
print(json.dumps({"published": k, "seconds": elapsed, "seqs": seqs, "first": first,
                  "acked": sum(1 for i in infos if i.is_published())}))
"""


def payload_template() -> dict[str, Any]:
    """A real detector's result (two detections), as the MQTT sink sends it."""
    import numpy as np

    from edgeinfer.frames import Detection, Frame, ModelRef, Result, TaskResult

    frame = Frame(index=1, ts=0.0, wall=time.time(), data=np.zeros((480, 640, 3), np.uint8))
    task = TaskResult(detections=(Detection("person", 0, 0.91, (10.0, 20.0, 200.0, 400.0)),
                                  Detection("dog", 16, 0.77, (220.0, 240.0, 380.0, 460.0))))
    result = Result(1, time.time(), PIPELINE, frame, ModelRef("nudenet-320n", "1", "ab" * 32),
                    "CPUExecutionProvider", (1.2, 20.5, 0.4), task)
    doc: dict[str, Any] = json.loads(result.to_json())
    doc["run_id"] = uuid.uuid4().hex
    return doc


def collect_yaml(folder: Path, dsn: str, port: int, name: str, metrics: int) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({
        "database": {"dsn": dsn, "schema": "edgeinfer"},
        # A group per phase: a stopped collector's persistent session stays a member of its
        # group and keeps taking its share until the session expires (docs/fleet.md).
        "source": {"type": "mqtt", "host": "127.0.0.1", "port": port, "prefix": PREFIX,
                   "client_id": f"bench-{name}", "group": f"bench-{name.split('-')[0]}"},
        "metrics": {"host": "127.0.0.1", "port": metrics},
        "logging_level": "warning"}))
    return path


def start_collector(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgeinfer", "collect", "-c", str(config)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def scrape(port: int) -> dict[str, float]:
    """The collector's /metrics as ``{"name{labels}": value}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("edgeinfer_collect"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def wait_ready(procs: list[subprocess.Popen[str]], ports: list[int], broker_port: int) -> None:
    """Publish probe results until every collector received one (its subscription is live)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    probe = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    probe.connect("127.0.0.1", broker_port)
    probe.loop_start()
    deadline = time.monotonic() + 60
    try:
        for seq in range(1_000_000):
            if time.monotonic() > deadline:
                raise RuntimeError("collectors not ready in 60 s: " + " | ".join(
                    p.stderr.read() if p.poll() is not None and p.stderr else "running"
                    for p in procs))
            body = json.dumps({"seq": seq, "run_id": "probe", "ts": time.time()})
            probe.publish(f"{PREFIX}/probe/{PIPELINE}/result", body, qos=1)
            time.sleep(0.2)
            try:
                if all(_received(scrape(port)) > 0 for port in ports):
                    return
            except OSError:
                continue
    finally:
        probe.loop_stop()
        probe.disconnect()


def _received(metrics: dict[str, float]) -> float:
    return next((v for k, v in metrics.items() if k.startswith("edgeinfer_collect_received")), 0.0)


def run_load(args: argparse.Namespace, broker_port: int, run_id: str,
             template: dict[str, Any]) -> tuple[list[subprocess.Popen[str]], float]:
    """Start the publisher processes; returns them and the wall time the load starts."""
    half = args.devices // 2
    shares = [(0, half), (half, args.devices - half)]
    procs = []
    for first, count in shares:
        rate = args.rate * count / args.devices
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _PUBLISHER, str(broker_port), PREFIX, str(first), str(count),
             str(rate), str(args.seconds), run_id, json.dumps(template)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs, time.time() + 1.0  # the publishers connect for 1 s first


def phase(args: argparse.Namespace, pg: Any, broker: Any, folder: Path, collectors: int,
          template: dict[str, Any]) -> dict[str, Any]:
    """One load phase with ``collectors`` collectors; the figures of section 1 or 2."""
    import psutil
    import psycopg

    from edgeinfer._net import free_port

    ports = [free_port() for _ in range(collectors)]
    configs = [collect_yaml(folder, pg.dsn, broker.port, f"c{collectors}-{i}", ports[i])
               for i in range(collectors)]
    procs = [start_collector(c) for c in configs]
    try:
        wait_ready(procs, ports, broker.port)
        run_id = uuid.uuid4().hex
        cpu0 = [sum(psutil.Process(p.pid).cpu_times()[:2]) for p in procs]
        publishers, t0 = run_load(args, broker.port, run_id, template)
        outs = [json.loads(p.communicate(timeout=args.seconds + 120)[0]) for p in publishers]
        t1 = t0 + max(o["seconds"] for o in outs)
        published = sum(o["published"] for o in outs)
        lag_metrics = [scrape(port) for port in ports]
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            at_end = _count(conn, run_id, t1)
            drained = _drain(conn, run_id, published, deadline=time.monotonic() + 120)
            cpu = sum(sum(psutil.Process(p.pid).cpu_times()[:2]) - c for p, c in zip(procs, cpu0))
            figures = _database_figures(conn, run_id, t0, t1)
            missing = _missing(conn, run_id, outs)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        summaries = [p.communicate(timeout=60)[1].strip().splitlines() for p in procs]
    return {
        "collectors": collectors, "devices": args.devices, "seconds": round(t1 - t0, 2),
        "published": published, "offered_per_s": round(published / (t1 - t0), 1),
        "acked_by_broker": sum(o["acked"] for o in outs),
        "backlog_at_end": published - at_end, "drain_s": round(drained, 2),
        "cpu_us_per_result": round(cpu / max(figures["rows"], 1) * 1e6, 1),
        "missing": missing, **figures,
        "collector_lag_s": [{k.split("{")[1].rstrip("}"): round(v, 4)
                             for k, v in m.items() if k.startswith("edgeinfer_collect_lag")}
                            for m in lag_metrics],
        "summaries": [s[-1] if s else "" for s in summaries],
    }


def _count(conn: Any, run_id: str, before: float | None = None) -> int:
    query = "SELECT count(*) FROM edgeinfer.results WHERE run_id = %s"
    params: list[Any] = [run_id]
    if before is not None:
        query += " AND committed <= to_timestamp(%s)"
        params.append(before)
    return int(conn.execute(query, params).fetchone()[0])


def _drain(conn: Any, run_id: str, published: int, deadline: float) -> float:
    started = time.monotonic()
    while _count(conn, run_id) < published and time.monotonic() < deadline:
        time.sleep(0.1)
    return time.monotonic() - started


def _database_figures(conn: Any, run_id: str, t0: float, t1: float) -> dict[str, Any]:
    rows, keys, p50, p99, mx, during = conn.execute(
        """SELECT count(*), count(DISTINCT (device, pipeline, run_id, seq)),
                  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM committed - ts)),
                  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM committed - ts)),
                  max(extract(epoch FROM committed - ts)),
                  count(*) FILTER (WHERE committed <= to_timestamp(%s))
             FROM edgeinfer.results WHERE run_id = %s""", [t1, run_id]).fetchone()
    return {"rows": int(rows), "distinct_keys": int(keys),
            "committed_per_s_during_load": round(int(during) / (t1 - t0), 1),
            "lag_s": {"p50": round(float(p50), 4), "p99": round(float(p99), 4),
                      "max": round(float(mx), 4)}}


def _missing(conn: Any, run_id: str, outs: list[dict[str, Any]]) -> int:
    """Published keys absent from the database (each device's seqs are 0..n-1)."""
    have = dict(conn.execute(
        "SELECT device, count(DISTINCT seq) FROM edgeinfer.results WHERE run_id = %s "
        "GROUP BY device", [run_id]).fetchall())
    return sum(max(n - have.get(f"dev{o['first'] + j:04d}", 0), 0)
               for o in outs for j, n in enumerate(o["seqs"]))


def write_vs_copy(pg: Any, rows: int, batch: int, rounds: int, template: dict[str, Any],
                  copy_from: int = 500) -> dict[str, Any]:
    """Section 3: ``Database.write`` against a raw COPY of the same rows, alternating."""
    import datetime as dt

    import psycopg

    from edgeinfer.config.collect import DatabaseConfig
    from edgeinfer.fleet.db import Database
    from edgeinfer.fleet.records import parse

    now = time.time()
    records = []
    for i in range(rows):
        body = dict(template, seq=i // 200, run_id="w", ts=now + i / 2000)
        records.append(parse(f"{PREFIX}/dev{i % 200:04d}/{PIPELINE}/result",
                             json.dumps(body).encode(), PREFIX, now))
    write_s, copy_s = [], []
    for r in range(rounds):
        db = Database(DatabaseConfig(dsn=pg.dsn, schema=f"w{r}"), copy_from=copy_from)
        db.connect()
        db.migrate()
        db.maintain(now)
        started = time.perf_counter()
        for i in range(0, rows, batch):
            db.write(records[i:i + batch])
        write_s.append(time.perf_counter() - started)
        db.close()
        copy_db = Database(DatabaseConfig(dsn=pg.dsn, schema=f"c{r}"))
        copy_db.connect()
        copy_db.migrate()
        copy_db.maintain(now)
        copy_db.close()
        with psycopg.connect(pg.dsn) as conn:
            started = time.perf_counter()
            for i in range(0, rows, batch):
                with conn.transaction(), conn.cursor() as cur, cur.copy(
                        f"COPY c{r}.results (device, pipeline, run_id, seq, ts, received, "
                        "payload) FROM STDIN") as pipe:
                    for rec in records[i:i + batch]:
                        pipe.write_row((rec.device, rec.pipeline, rec.run_id, rec.seq,
                                        dt.datetime.fromtimestamp(rec.ts, dt.UTC),
                                        dt.datetime.fromtimestamp(rec.received, dt.UTC),
                                        rec.payload))
            copy_s.append(time.perf_counter() - started)
    write, copy = statistics.median(write_s), statistics.median(copy_s)
    return {"rows": rows, "batch": batch, "copy_from": copy_from, "rounds": rounds,
            "write_rows_per_s": round(rows / write), "copy_rows_per_s": round(rows / copy),
            "ratio": round(copy / write, 3),
            "per_round": [round(c / w, 3) for w, c in zip(write_s, copy_s)]}


def report(doc: dict[str, Any]) -> str:
    one, two = doc["one"], doc["two"]
    lines = [f"- {doc['devices']} simulated devices (MQTT 5, QoS 1, {doc['payload_bytes']}-byte "
             f"results), offered {one['offered_per_s']}/s for {one['seconds']} s to mosquitto;"]
    for p in (one, two):
        lines.append(
            f"- {p['collectors']} collector(s): committed {p['committed_per_s_during_load']}/s "
            f"while the load ran, backlog at its end {p['backlog_at_end']} (drained in "
            f"{p['drain_s']} s); lag device ts -> commit p50 {p['lag_s']['p50']} s, p99 "
            f"{p['lag_s']['p99']} s, max {p['lag_s']['max']} s; collector CPU "
            f"{p['cpu_us_per_result']} us per result; {p['rows']} rows for {p['published']} "
            f"published, {p['distinct_keys']} distinct keys, {p['missing']} missing "
            f"({sum(_batches(s) for s in p['summaries'])} batches).")
    for wc in doc["write_vs_copy"]:
        lines.append(f"- Write path (`Database.write`) {wc['write_rows_per_s']} rows/s vs raw "
                     f"COPY {wc['copy_rows_per_s']} rows/s of the same {wc['rows']} rows in "
                     f"batches of {wc['batch']} (copy_from {wc['copy_from']}): {wc['ratio']}x "
                     f"(rounds {wc['per_round']}).")
    return "\n".join(lines)


def _batches(summary: str) -> int:
    try:
        return int(json.loads(summary.partition(": ")[2])["batches"])
    except (ValueError, KeyError, TypeError):
        return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--quick", action="store_true", help="8 s phases, 20,000 rows, 3 rounds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 8.0)
    from edgeinfer.testing.mosquitto import Mosquitto
    from edgeinfer.testing.postgres import Postgres

    template = payload_template()
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-fleet-") as tmp, \
            Postgres(Path(tmp) / "pg") as pg, Mosquitto(extra_config=BROKER_CONFIG) as broker:
        doc: dict[str, Any] = {"devices": args.devices, "rate": args.rate,
                               "payload_bytes": len(json.dumps(template))}
        doc["one"] = phase(args, pg, broker, Path(tmp), 1, template)
        doc["two"] = phase(args, pg, broker, Path(tmp), 2, template)
        # 2000: batch.max_rows (the COPY path); 400: what 2,000/s fills in max_age_s 0.2, under
        # copy_from 500 (the multi-row INSERT path the load above mostly took), and with COPY.
        doc["write_vs_copy"] = [write_vs_copy(pg, 20_000 if args.quick else 60_000, batch,
                                              3 if args.quick else 5, template, copy_from)
                                for batch, copy_from in ((2000, 500), (400, 500), (400, 1))]
    text = report(doc)
    print(json.dumps(doc, indent=2) if args.json else text)
    if not args.no_write:
        from _report import write_section

        write_section(ROOT / "docs" / "benchmarks.md", "fleet",
                      "Fleet collector (simulated devices -> mosquitto -> PostgreSQL)",
                      f"{text}\n\nTargets: p99 lag <= 0.5 s, <= 150 us of collector CPU per "
                      "result, write path >= 0.8x raw COPY.",
                      "python3 bench/fleet.py" + (" --quick" if args.quick else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
