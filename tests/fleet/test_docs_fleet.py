"""docs/fleet.md's blocks run: the collect.yaml validates (``edgeinfer validate-config``, its
credentials given), the PostgreSQL set-up creates a role that `edgeinfer collect
--migrate-only` then uses, the example queries and the Grafana query (its macros expanded as
Grafana does) run on the migrated schema, mosquitto starts with the broker config and
nats-server accepts the node config. A config or SQL block that none of these takes fails, so
a new one gets tested."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeinfer._net import free_port
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.postgres import Postgres

psycopg = pytest.importorskip("psycopg")

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(?P<lang>[A-Za-z]*)\n(?P<body>.*?)^```$", re.M | re.S)
BLOCKS = [(m["lang"], m["body"]) for m in FENCE.finditer(
    (ROOT / "docs" / "fleet.md").read_text(encoding="utf-8"))]
# Blocks that are neither config nor SQL: the diagram, command synopses, printed output.
TEXT = ("devices --MQTT-->", "edgeinfer collect -c", "edgeinfer fleet --host", "DEVICE  STATE")


def _blocks(lang: str, first: str = "") -> list[str]:
    return [body for block_lang, body in BLOCKS if block_lang == lang and body.startswith(first)]


def test_every_block_is_run_or_plain_text() -> None:
    taken = (len(_blocks("yaml")) + len(_blocks("sql")) + len(_blocks("", "listener "))
             + len(_blocks("", "server_name:")))
    text = [body for lang, body in BLOCKS if lang == "" and body.startswith(TEXT)]
    assert taken + len(text) == len(BLOCKS), [b[:40] for _, b in BLOCKS]


def test_collect_yaml_validates(tmp_path: Path) -> None:
    (secrets := tmp_path / "credentials").mkdir()
    for name in ("pg_password", "mqtt_password"):
        (secrets / name).write_text("s3cret")
    for i, body in enumerate(_blocks("yaml")):
        config = tmp_path / f"collect{i}.yaml"
        config.write_text(body)
        done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(config)],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "CREDENTIALS_DIRECTORY": str(secrets)})
        assert done.returncode == 0 and "OK (collector" in done.stdout, done.stderr


def test_postgres_setup_then_the_queries(tmp_path: Path, postgres: Postgres) -> None:
    if not postgres.running:
        postgres.start()
    setup, *queries = _blocks("sql")
    assert "CREATE ROLE edgeinfer" in setup
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS fleet")
        conn.execute("DROP ROLE IF EXISTS edgeinfer")
        for statement in _statements(setup):
            conn.execute(statement)
    dsn = f"postgresql://edgeinfer@{postgres.host}:{postgres.port}/fleet"
    config = tmp_path / "collect.yaml"
    config.write_text(f"database: {{dsn: '{dsn}'}}\nsource: {{type: mqtt, port: {free_port()}}}\n")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "collect", "-c", str(config),
                           "--migrate-only"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    grafana = {r"\$__timeGroupAlias\((\w+), '1m'\)": r"date_trunc('minute', \1) AS time",
               r"\$__timeFilter\((\w+)\)": r"\1 > now() - interval '1 hour'"}
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO edgeinfer.results (device, pipeline, run_id, seq, ts,"
                     " received, payload) VALUES ('cam1', 'door', 'r1', 1, now(), now(),"
                     " '{\"latency_ms\": {\"pre\": 1, \"infer\": 2, \"post\": 1e-400}}')")
        for query in queries:
            for macro, expansion in grafana.items():
                query = re.sub(macro, expansion, query)
            conn.execute(query).fetchall()
        conn.rollback()


def _statements(block: str) -> list[str]:
    lines = [line for line in block.splitlines() if not line.startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def test_the_broker_config_starts_mosquitto() -> None:
    [block] = _blocks("", "listener ")
    # The listener and the data folder are the test broker's own; every other line as written.
    lines = [line for line in block.splitlines()
             if not line.startswith(("listener", "persistence_location", "persistence "))]
    with Mosquitto("\n".join(lines) + "\n", persistence=True) as broker:
        assert broker.port > 0


def test_the_nats_node_config_is_accepted(tmp_path: Path) -> None:
    server = shutil.which("nats-server")
    if server is None:
        pytest.skip("nats-server not installed")
    [block] = _blocks("", "server_name:")
    config = tmp_path / "n0.conf"
    config.write_text(block.replace("/var/lib/nats", str(tmp_path / "js")))
    done = subprocess.run([server, "-c", str(config), "-t"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr + done.stdout
