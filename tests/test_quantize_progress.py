"""``edgeinfer quantize`` says what it is doing from its first second (in a pipe too), holds a
bounded share of the calibration data at once, prints each failure once, and gives no verdict
on too little evidence (it asks for more data, naming the option)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeinfer.config.pipeline import DetectTask, PreprocessConfig
from edgeinfer.errors import ConfigError, ModelError
from edgeinfer.quantize import quantize_model
from edgeinfer.tasks.metrics import MIN_BOXES
from edgeinfer.testing.detector_models import conv_detector_model, detector_images

SIZE = 64
CONFIG = DetectTask(decoder="yolov8", preprocess=PreprocessConfig(size=[SIZE, SIZE]))


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("detector")
    return conv_detector_model(folder / "det.onnx"), detector_images(folder / "images", 60)


def _config(tmp_path: Path, model: Path, images: Path) -> Path:
    cfg = tmp_path / "det.yaml"
    cfg.write_text(f"pipelines:\n  - name: det\n    source: {{type: images, uri: '{images}'}}\n"
                   f"    model: {{path: '{model}'}}\n    task: {{type: detect, decoder: yolov8, "
                   f"preprocess: {{size: [{SIZE}, {SIZE}]}}}}\n")
    return cfg


def _cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "edgeinfer", "quantize", *map(str, args)]


# --- progress ---------------------------------------------------------------------------------

def test_progress_from_the_start_in_a_pipe_one_line_per_step(detector: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    """The first line comes while the command still runs, before calibration starts; every
    stage shows in order; in a pipe there are lines, no carriage-return redraws (``--json``:
    stdout stays the card alone)."""
    model, images = detector
    proc = subprocess.Popen(_cmd(model, tmp_path / "q.onnx", "--calibration", images, "-c",
                                 _config(tmp_path, model, images), "--json"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        first = proc.stderr.readline()
        still_running = proc.poll() is None
        rest = proc.stderr.read()
        out = proc.stdout.read()
        proc.wait(timeout=300)
    finally:
        proc.kill()
    assert still_running and "loading" in first, first
    lines = (first + rest).splitlines()
    assert "\r" not in first + rest
    stages = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    order = ["loading", "reading calibration data 0/60", "reading calibration data 60/60",
             "calibrating 0/48", "calibrating 48/48",
             "computing activation ranges, writing the INT8 graph", "loading the INT8 model",
             "evaluating 0/12", "evaluating 12/12"]
    assert [s for s in stages if s in order] == order, stages
    assert stages[-1].startswith("done: peak memory ")
    assert json.loads(out)["runtime"]["peak_rss_mib"] > 0
    assert proc.returncode in (0, ModelError.exit_code), rest


def test_stages_reach_a_python_caller(detector: tuple[Path, Path], tmp_path: Path) -> None:
    model, images = detector
    seen: list[tuple[str, int, int]] = []
    calls: list[tuple[int, int]] = []
    quantize_model(model, tmp_path / "q.onnx", images, config=CONFIG, samples=8,
                   stages=lambda s, d, t: seen.append((s, d, t)),
                   progress=lambda d, t: calls.append((d, t)))
    assert seen[0] == ("loading", 0, 0)
    assert ("calibrating", 8, 8) in seen and ("evaluating", 2, 2) in seen
    assert calls[-1] == (8, 8)  # the old progress callback: calibration only


# --- memory -----------------------------------------------------------------------------------

def _wide_model(path: Path, side: int, channels: int) -> int:
    """x [1, 3, side, side] -> three 3x3 convolutions of ``channels`` (ReLU between) -> 1x1 to
    4 -> sigmoid; returns the bytes of the float tensors one run makes (what a calibrator that
    keeps every tensor of every sample holds per sample)."""
    rng = np.random.default_rng(0)
    inits, nodes, prev, cin = [], [], "x", 3
    for i in range(3):
        w = rng.normal(0, 0.3, (channels, cin, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                   pads=[1] * 4),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        prev, cin = f"r{i}", channels
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (4, channels, 1, 1)).astype(
        np.float32), "wo"))
    nodes += [helper.make_node("Conv", [prev, "wo"], ["co"], name="convo"),
              helper.make_node("Sigmoid", ["co"], ["y"], name="sig")]
    graph = helper.make_graph(
        nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, side, side])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return 4 * side * side * (3 + 6 * channels + 2 * 4)


def _rss() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


def test_calibration_memory_does_not_grow_with_the_sample_count(tmp_path: Path) -> None:
    """onnxruntime's histogram calibrators (percentile, the default; entropy) keep every
    calibrated tensor of every sample they are given in one go. Read through the calibration
    reader (``progress`` hears each sample it hands over), the memory grew by one sample's
    tensors a sample (before: 737 MB over 64 samples of 14 MB here; now 57 MB); given windows of a
    few samples it stays within 12 samples' worth plus 64 MB, whatever the count. (MinMax
    reduces each tensor inside the graph: it held little before too.)"""
    per_sample = _wide_model(tmp_path / "wide.onnx", 96, 64)
    x = np.random.default_rng(1).random((64, 1, 3, 96, 96), dtype=np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    seen: list[int] = []
    quantize_model(tmp_path / "wide.onnx", tmp_path / "q.onnx", tmp_path / "calib.npz",
                   progress=lambda done, total: seen.append(_rss()))
    assert len(seen) >= 48
    growth = max(seen) - seen[0]
    assert growth < 12 * per_sample + 64 * 2**20, (growth / 2**20, per_sample / 2**20)


# --- failures once, evidence ----------------------------------------------------------------

def test_a_failing_verdict_is_printed_once(detector: tuple[Path, Path], tmp_path: Path) -> None:
    model, images = detector
    proc = subprocess.run(_cmd(model, tmp_path / "q.onnx", "--calibration", images, "-c",
                               _config(tmp_path, model, images), "--quantize-head"),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == ModelError.exit_code, proc.stderr
    both = proc.stdout + proc.stderr
    assert both.count("score distributions differ") == 1, both
    assert "verdict       FAIL (on " in proc.stdout and "float boxes at score >= 0.25" in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "fails the accuracy check" in errors[0]


def test_too_few_boxes_is_no_verdict_and_asks_for_more_data(detector: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """Two held-out pictures hold a handful of float boxes: neither pass nor fail, but a request
    for more held-out data naming the option; with enough of them, a verdict again."""
    model, images = detector
    card = quantize_model(model, tmp_path / "q.onnx", images, config=CONFIG, samples=8)
    r = card.report
    assert r["samples"] == 2 and r["evidence"]["count"] < MIN_BOXES
    assert r["verdict"] == "insufficient" and card.passed is None
    assert "--held-out DIR" in r["more_data"] and f"at least {MIN_BOXES}" in r["more_data"]
    assert f"rests on {r['evidence']['count']} float boxes" in r["more_data"]
    assert any("rests on 2 held-out inputs" in w for w in card.warnings)
    full = quantize_model(model, tmp_path / "full.onnx", images, config=CONFIG)
    assert full.report["evidence"]["count"] >= MIN_BOXES
    assert full.report["verdict"] == "pass" and full.passed is True


def test_no_float_box_at_all_is_not_a_pass(tmp_path: Path) -> None:
    """Dark pictures: the float model finds nothing, and nothing is no evidence (before: pass)."""
    model = conv_detector_model(tmp_path / "det.onnx")
    folder = tmp_path / "dark"
    folder.mkdir()
    for i in range(12):
        cv2.imwrite(str(folder / f"d{i}.png"), np.full((SIZE, SIZE, 3), 5 + i, np.uint8))
    card = quantize_model(model, tmp_path / "q.onnx", folder, config=CONFIG)
    assert card.report["evidence"]["count"] == 0
    assert card.report["verdict"] == "insufficient" and card.passed is None


def test_cli_asks_for_more_data_once_and_exits_78(detector: tuple[Path, Path], tmp_path: Path
                                                  ) -> None:
    model, images = detector
    proc = subprocess.run(_cmd(model, tmp_path / "q.onnx", "--calibration", images, "-c",
                               _config(tmp_path, model, images), "--samples", "8"),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == ConfigError.exit_code, proc.stderr
    assert "verdict       NOT JUDGED: the accuracy check rests on" in proc.stdout
    assert (proc.stdout + proc.stderr).count("--held-out DIR, or a larger") == 1
    assert "written but not judged" in proc.stderr.splitlines()[-1]
    assert (tmp_path / "q.onnx").is_file()  # written, for inspection
