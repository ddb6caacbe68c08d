"""The optional Prometheus endpoint: config, the scrape-time collector on a fake daemon, and
``edgeinfer run`` serving ``/metrics`` on loopback until SIGTERM closes the port."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from edgeinfer import samples
from edgeinfer.config import MetricsConfig, parse_config

prometheus_client = pytest.importorskip("prometheus_client")

from edgeinfer.control.metrics import MetricsServer, build_registry  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        return str(r.read().decode())


def value(text: str, sample: str) -> float | None:
    m = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_metrics_config_defaults_bounds_and_unknown_keys() -> None:
    c = MetricsConfig()
    assert (c.enabled, c.host, c.port) == (True, "127.0.0.1", 9108)
    assert parse_config(json.dumps({"metrics": {"port": 9200}})).metrics == MetricsConfig(
        port=9200)
    assert parse_config("{}").metrics is None
    for bad in ({"port": 0}, {"port": 65536}, {"bogus": 1}):
        with pytest.raises(Exception, match=r"metrics"):
            parse_config(json.dumps({"metrics": bad}))
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"port": 70000}, MetricsConfig)


class FakePipeline:
    def __init__(self, name: str, processed: int) -> None:
        self.name, self.processed, self.calls = name, processed, 0

    def snapshot(self) -> dict[str, Any]:
        self.calls += 1
        lat = {"p50": 2.5, "p99": 9.0, "mean": 3.0}
        return {"pipeline": self.name, "processed": self.processed, "emitted": 7,
                "dropped": {"queue": 3, "task": 1, "paused": 0}, "errors": 2, "fps": 14.5,
                "latency_ms": {"pre": lat, "infer": lat, "post": lat, "end_to_end": lat},
                "model": {"name": "det", "version": None, "sha256": "ab" * 32},
                "provider": "cpu", "source": {"reconnects": 4, "retries": 9},
                "state": "no_source"}


def test_collector_reads_snapshots_only_when_scraped() -> None:
    pipe = FakePipeline("cam", 42)
    plumbing = SimpleNamespace(stats=lambda: {"depth": 5, "dropped": 6})
    daemon = SimpleNamespace(pipelines=[pipe], link=SimpleNamespace(plumbing=plumbing),
                             restarts={"cam": 1, "gone": 2})
    registry = build_registry(daemon)
    assert pipe.calls == 0  # registering does not collect
    text = prometheus_client.generate_latest(registry).decode()
    assert pipe.calls == 1
    assert value(text, 'edgeinfer_frames_processed_total{pipeline="cam"}') == 42
    assert value(text, 'edgeinfer_results_emitted_total{pipeline="cam"}') == 7
    assert value(text, 'edgeinfer_frames_dropped_total{pipeline="cam",reason="queue"}') == 3
    assert value(text, 'edgeinfer_inference_errors_total{pipeline="cam"}') == 2
    assert value(text, 'edgeinfer_fps{pipeline="cam"}') == 14.5
    assert value(text, 'edgeinfer_latency_ms{pipeline="cam",quantile="0.99",'
                       'stage="infer"}') == 9.0
    assert value(text, 'edgeinfer_source_reconnects_total{pipeline="cam"}') == 4
    assert value(text, 'edgeinfer_source_retries_total{pipeline="cam"}') == 9
    assert value(text, 'edgeinfer_pipeline_state{pipeline="cam",state="no_source"}') == 1
    assert value(text, 'edgeinfer_pipeline_state{pipeline="cam",state="running"}') == 0
    assert value(text, f'edgeinfer_model_info{{name="det",pipeline="cam",provider="cpu",'
                       f'sha256="{"ab" * 32}",version=""}}') == 1
    assert value(text, 'edgeinfer_pipeline_restarts_total{pipeline="cam"}') == 1
    assert value(text, 'edgeinfer_pipeline_restarts_total{pipeline="gone"}') == 2
    assert value(text, "edgeinfer_outbox_depth") == 5
    assert value(text, "edgeinfer_outbox_dropped_total") == 6
    assert "process_cpu" not in text and "python_gc" not in text  # its own registry
    no_mqtt = prometheus_client.generate_latest(
        build_registry(SimpleNamespace(pipelines=[], link=None, restarts={}))).decode()
    assert "edgeinfer_outbox" not in no_mqtt


def test_server_stops_and_closes_its_port() -> None:
    port = free_port()
    server = MetricsServer(SimpleNamespace(pipelines=[FakePipeline("a", 1)], link=None,
                                           restarts={}), MetricsConfig(port=port))
    server.start()
    try:
        assert 'edgeinfer_frames_processed_total{pipeline="a"} 1.0' in scrape(port)
    finally:
        server.stop()
    assert not port_open(port)
    server.stop()  # idempotent


def test_edgeinfer_run_serves_metrics_until_sigterm(blazeface_path: Path,
                                                    tmp_path: Path) -> None:
    video = samples.demo_video(tmp_path / "people.avi", frames=10)
    port = free_port()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"device_id": "test", "metrics": {"port": port}, "pipelines": [{
        "name": "faces",
        "source": {"type": "video", "uri": str(video), "loop": True, "fps": 30},
        "model": {"path": str(blazeface_path), "threads": 1},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        "sinks": [{"type": "jsonl", "path": str(tmp_path / "out.jsonl")}],
    }]}))
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        text, processed = "", None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                text = scrape(port)
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
                continue
            processed = value(text, 'edgeinfer_frames_processed_total{pipeline="faces"}')
            if processed and "edgeinfer_model_info{" in text:
                break
            time.sleep(0.2)
        assert processed and processed > 0, (text, proc.poll())
        assert re.search(r'^edgeinfer_model_info\{name="[^"]+",pipeline="faces",provider="[^"]+",'
                         r'sha256="[0-9a-f]{64}",version="[^"]*"\} 1\.0$', text, re.M), text
        assert 'edgeinfer_latency_ms{pipeline="faces",quantile="0.5",stage="infer"}' in text
        assert "edgeinfer_outbox_depth" not in text  # no mqtt: section
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert not port_open(port)
