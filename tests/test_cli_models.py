"""`info` and `quantize` on the README's own model, word for word.

Before: `edgeinfer info nudenet-320n` printed onnxruntime internals (`op_kernel.cc:87 virtual
OrtValue* ...; pass input_shapes`) and a 300-character symbolic output shape while `models list`
said 1x3x320x320; `quantize` had no `--input-shape`, wrote the model with mode 0600 (unreadable
by the service's DynamicUser) and let onnxruntime's warnings through.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
cv2 = pytest.importorskip("cv2")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
                          preexec_fn=lambda: os.umask(0o022))


def test_info_of_an_example_model_uses_its_catalog_shapes(yolo_path: Path) -> None:
    proc = _cli("info", "nudenet-320n")
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(None, 1) for line in proc.stdout.splitlines()
                if line and not line.startswith(" ") and " " in line)
    assert rows["warm-up"].endswith(" ms"), proc.stdout  # warmed up, not skipped
    assert "images               float32  1x3x320x320" in proc.stdout
    assert "output0              float32  1x22x2100" in proc.stdout
    assert "WARNING" not in proc.stderr, proc.stderr
    # the user's own shape wins over the catalog's
    proc = _cli("info", "nudenet-320n", "--input-shape", "images=1,3,640,640")
    assert proc.returncode == 0 and "1x22x8400" in proc.stdout, proc.stdout + proc.stderr


def _without_imgsz(example: Path, dest: Path) -> Path:
    """The example model without its size in the metadata (Ultralytics' imgsz): other bytes,
    so neither the catalog nor the metadata knows its size (a copy of the same bytes is the
    example model, sized as it is)."""
    model = onnx.load(example)
    props = {p.key: p.value for p in model.metadata_props if p.key != "imgsz"}
    del model.metadata_props[:]
    helper.set_model_props(model, props)
    onnx.save(model, dest)
    return dest


def test_a_model_refusing_guessed_shapes_gets_the_cli_flag_not_runtime_internals(
        yolo_path: Path, tmp_path: Path) -> None:
    mine = _without_imgsz(yolo_path, tmp_path / "mine.onnx")
    proc = _cli("info", mine)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout + proc.stderr
    assert "op_kernel.cc" not in text and "OrtValue" not in text, text
    assert re.search(r"at its \w+ node '/model\.\d+/\w+'", proc.stdout), proc.stdout
    assert "--input-shape images=batch,3,height,width" in proc.stdout
    assert "output0              float32  batchx22x?" in proc.stdout  # not the 300-char formula
    longest = max(proc.stdout.splitlines(), key=len)
    assert len(longest) < 300, longest


def _dynamic_conv(path: Path, opset: int) -> Path:
    """``x [N, 3, H, W]`` -> 3x3 conv (4) -> ``y``: dynamic sizes, an old opset (onnxruntime's
    quantizer warns about opset 10 through the root logger)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4)], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.save(model, str(path))
    return path


def test_quantize_takes_input_shape_writes_0644_and_keeps_onnxruntime_quiet(
        tmp_path: Path) -> None:
    """Named by a relative path (as a user types it), the model skipped onnxruntime's
    pre-processing (resolved after a chdir) and onnxruntime warned twice about it."""
    _dynamic_conv(tmp_path / "dyn.onnx", 10)
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(1)
    for i in range(24):
        cv2.imwrite(str(images / f"{i}.png"), rng.integers(0, 256, (20, 20, 3), dtype=np.uint8))
    proc = _cli("quantize", "dyn.onnx", "q.onnx", "--calibration", "images", cwd=tmp_path)
    assert proc.returncode == 78 and "dynamic size" in proc.stderr, proc.stderr
    proc = _cli("quantize", "dyn.onnx", "q.onnx", "--calibration", "images", "--input-shape",
                "x=1,3,16,16", "--no-per-channel", "--json",  # per-channel QDQ needs opset 13
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "q.onnx").stat().st_mode) == 0o644
    assert "WARNING" not in proc.stderr and "pre-processing" not in proc.stderr, proc.stderr
    assert not json.loads(proc.stdout)["settings"]["preprocessing"].startswith("none")


def test_onnxruntime_quantizer_advice_stays_at_debug(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What onnxruntime's quantizer says through the root logger (here: its real opset-10
    advice) is kept at debug level under edgeinfer.quantize while edgeinfer quantizes."""
    from onnxruntime.quantization.quant_utils import update_opset_version

    from edgeinfer.quantize.run import _onnxruntime_quiet

    model = onnx.load(str(_dynamic_conv(tmp_path / "old.onnx", 10)))
    with caplog.at_level(logging.DEBUG), _onnxruntime_quiet():
        update_opset_version(model, TensorProto.INT8)
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warned, warned
    assert any("opset version is 10" in r.getMessage() and r.name == "edgeinfer.quantize"
               for r in caplog.records), caplog.records
    update_opset_version(model, TensorProto.INT8)  # outside: onnxruntime's own behaviour
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_formula_dimensions_are_a_question_mark_in_messages(yolo_path: Path,
                                                            tmp_path: Path) -> None:
    """`run` said `mine has output0 [batch, 22, (floor(floor(floor(height/2 - 1/2)/2)/2) + 1)*
    ...]` (300 characters) when the task did not fit the model."""
    import edgeinfer
    from edgeinfer.runtime.base import format_shape

    mine = _without_imgsz(yolo_path, tmp_path / "mine.onnx")  # its dynamic shapes stay
    with edgeinfer.load_model(mine, warmup=False) as m:
        shape = m.outputs[0].shape
    assert len(str(shape[2])) > 100  # onnxruntime's formula, as it comes
    assert format_shape(shape) == "[batch, 22, ?]"
