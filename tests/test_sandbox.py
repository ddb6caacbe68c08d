"""The port drop-in made from a config: the service may bind exactly the ports it listens on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from edgeinfer.config import parse_config
from edgeinfer.daemon.sandbox import listen_ports, socket_bind_dropin

BASE = """
pipelines:
  - {name: p, model: {path: m.onnx}, source: {type: synthetic}}
"""


def test_every_listener_is_allowed_and_nothing_else() -> None:
    config = parse_config(BASE + """
http: {port: 8081}
metrics: {port: 9100}
mqtt: {embedded: true, port: 18830}
""")
    assert listen_ports(config) == [(8081, "web view (http.port)"),
                                    (9100, "metrics (metrics.port)"),
                                    (18830, "embedded broker (mqtt.port)")]
    text = socket_bind_dropin(config, "c.yaml")
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["[Service]", "SocketBindDeny=any", "SocketBindAllow=tcp:8081",
                     "SocketBindAllow=tcp:9100", "SocketBindAllow=tcp:18830"]


def test_a_disabled_metrics_endpoint_and_a_remote_broker_bind_nothing() -> None:
    config = parse_config(BASE + """
metrics: {enabled: false, port: 9100}
mqtt: {host: broker.lan, port: 1883}
""")
    assert listen_ports(config) == []
    assert "SocketBindAllow" not in socket_bind_dropin(config)


def test_the_cli_prints_it(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + "http: {port: 8088}\n")
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config",
                           "--systemd-dropin", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# Made by") and "SocketBindAllow=tcp:8088\n" in done.stdout


def test_the_dropin_needs_no_credentials(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(BASE + "mqtt: {password: '${credential:mqtt_password}'}\n"
                    "http: {bind: 0.0.0.0, port: 8443, token: '${credential:http_token}'}\n")
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config",
                           "--systemd-dropin", str(path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "SocketBindAllow=tcp:8443\n" in done.stdout
    plain = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(path)],
                           capture_output=True, text=True, timeout=60, env=env)
    assert plain.returncode == 78 and "CREDENTIALS_DIRECTORY" in plain.stderr  # as before
