"""``edgeinfer bench`` on tiny built models, run as a user runs it (real subprocesses).

Only sanity orderings are asserted about timings: this machine is shared and noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.bench import make_inputs, parse_threads, summarize
from edgeinfer.errors import ConfigError
from edgeinfer.runtime.base import TensorSpec
from edgeinfer.testing import onnx_models, tflite_models

RUNS = "20"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", "bench", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def bench_json(*args: str) -> list[dict[str, Any]]:
    proc = cli(*args, "--runs", RUNS, "--warmup", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, Any]] = json.loads(proc.stdout)
    return rows


@pytest.fixture(scope="module")
def onnx_add(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return onnx_models.add_model(tmp_path_factory.mktemp("m") / "add.onnx", shape=(1, 64))


@pytest.fixture(scope="module")
def tflite_add(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tflite_models.add_model(tmp_path_factory.mktemp("m") / "add.tflite", shape=(1, 64))


@pytest.fixture(scope="module")
def onnx_dynamic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return onnx_models.add_model(tmp_path_factory.mktemp("m") / "dyn.onnx", shape=("batch", 8))


def check_row(row: dict[str, Any], runs: int = int(RUNS)) -> None:
    lat = row["latency_ms"]
    assert row["error"] is None
    assert row["provider"]
    assert row["runs"] == runs and len(row["latencies"]) == runs
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["min"] <= lat["mean"] <= lat["max"]
    # Throughput is timed over the whole loop, which holds every timed call: it can never beat
    # one call per mean latency (a little slack for the clocks' rounding). No lower bound: a
    # loaded machine stretches the loop, and timing is bench/'s business, not a test's.
    assert 0 < row["throughput"] <= 1000 / lat["mean"] * 1.01
    assert row["peak_rss_mb"] > 0 and row["peak_rss_mb"] >= row["baseline_rss_mb"] > 0
    assert row["load_ms"] > 0


def test_json_onnx_several_thread_counts(onnx_add: Path) -> None:
    rows = bench_json(str(onnx_add), "--threads", "1,2")
    assert [r["threads"] for r in rows] == [1, 2]
    for row in rows:
        check_row(row)
        assert row["provider"] == "CPUExecutionProvider"
        assert row["model"] == str(onnx_add)


def test_json_tflite(tflite_add: Path) -> None:
    (row,) = bench_json(str(tflite_add), "--threads", "1")
    check_row(row)


def test_all_providers_measures_at_least_cpu(onnx_add: Path) -> None:
    rows = bench_json(str(onnx_add), "--providers", "all", "--threads", "1")
    measured = [r for r in rows if r["error"] is None]
    assert "CPUExecutionProvider" in [r["provider"] for r in measured]
    for row in measured:
        check_row(row)


def test_unavailable_provider_is_a_failed_row(onnx_add: Path) -> None:
    rows = bench_json(str(onnx_add), "--providers", "cuda,cpu", "--threads", "1")
    assert [r["requested"] for r in rows] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    check_row(rows[1])
    assert rows[0]["error"] or rows[0]["provider"] == "CUDAExecutionProvider"


def test_tflite_refuses_onnx_provider_names(tflite_add: Path) -> None:
    proc = cli(str(tflite_add), "--providers", "cuda", "--runs", "3")
    assert proc.returncode == ConfigError.exit_code and "LiteRT" in proc.stderr


def test_silero_integer_input_gets_a_valid_value(silero_path: Path) -> None:
    # sr must be 8000 or 16000 and the window length is dynamic: the harness knows Silero.
    (row,) = bench_json(str(silero_path), "--threads", "1")
    check_row(row)


def test_table_and_plot(onnx_add: Path, tmp_path: Path) -> None:
    from PIL import Image

    png = tmp_path / "hist.png"
    proc = cli(str(onnx_add), "--threads", "1,2", "--runs", RUNS, "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("provider"))
    for col in ("threads", "load ms", "p50 ms", "p99 ms", "runs/s", "peak MiB"):
        assert col in lines[header]
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert [r[0] for r in rows] == ["CPU", "CPU"] and [r[1] for r in rows] == ["1", "2"]
    assert all(len(r) == 11 for r in rows)
    with Image.open(png) as img:
        img.verify()
    with Image.open(png) as img:
        assert img.format == "PNG"
        assert img.size == (720, 600)  # one 720x300 panel per configuration
        assert len(img.getcolors(1 << 16) or []) > 3  # drawn on, not blank


def test_dynamic_input_needs_shape(onnx_dynamic: Path) -> None:
    proc = cli(str(onnx_dynamic), "--runs", "3")
    assert proc.returncode == ConfigError.exit_code
    assert proc.stderr.startswith("edgeinfer: error: ")
    assert "--input-shape x=" in proc.stderr and "dynamic" in proc.stderr
    (row,) = bench_json(str(onnx_dynamic), "--input-shape", "x=4,8", "--threads", "1")
    check_row(row)


def test_corrupt_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 50)
    proc = cli(str(bad), "--runs", "3")
    assert proc.returncode == 65, proc.stderr
    assert proc.stderr.startswith("edgeinfer: error: ")
    assert "Traceback" not in proc.stderr


def test_missing_model(tmp_path: Path) -> None:
    proc = cli(str(tmp_path / "nope.onnx"))
    assert proc.returncode == 66
    assert proc.stderr.startswith("edgeinfer: error: ")


def test_bad_threads_and_runs(onnx_add: Path) -> None:
    proc = cli(str(onnx_add), "--threads", "0,x")
    assert proc.returncode == ConfigError.exit_code and "--threads" in proc.stderr
    proc = cli(str(onnx_add), "--runs", "0")
    assert proc.returncode == ConfigError.exit_code


def test_parse_threads() -> None:
    assert parse_threads(None) == [None]
    assert parse_threads("1,2,2,4") == [1, 2, 4]
    with pytest.raises(ConfigError):
        parse_threads("-1")


def test_summarize_orders() -> None:
    s = summarize([float(i) for i in range(1, 101)])
    assert s["min"] == 1 and s["max"] == 100 and s["mean"] == 50.5
    assert s["p50"] <= s["p90"] <= s["p99"] <= s["max"]


def test_make_inputs() -> None:
    import numpy as np

    specs = (TensorSpec("x", (1, 3), "float32"), TensorSpec("sr", (), "int64"),
             TensorSpec("ids", (1, "n"), "int64"))
    feeds = make_inputs(specs, {"ids": (1, 5)}, {"sr": 16000})
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (1, 3)
    assert feeds["sr"] == 16000 and feeds["sr"].dtype == np.int64
    assert feeds["ids"].shape == (1, 5) and not feeds["ids"].any()
    with pytest.raises(ConfigError, match="--input-shape ids="):
        make_inputs(specs, {}, {"sr": 16000})
