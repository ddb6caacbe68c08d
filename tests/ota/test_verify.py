"""OTA verification with real files, real models and real worker processes (no mocks):
``check_file`` for every reason it refuses, ``trial_run`` passing and refusing for every reason
a candidate can fail in its isolated worker."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeinfer.config import Config, PipelineConfig, load_config
from edgeinfer.errors import OtaRejected
from edgeinfer.ota.verify import VerifyReport, check_file, trial_run
from edgeinfer.testing import onnx_models

W = np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)  # the classifier's weights

DETECT_TASK = ("{type: detect, decoder: yolov8, preprocess: {size: [320, 320], "
               "scale: 0.00392}}")


# --- models and configs --------------------------------------------------------------------------



def _worker_children() -> set[int]:
    """Live worker processes (``python -m edgeinfer.runtime.worker_child``) of this process."""
    me, found = os.getpid(), set[int]()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            fields = stat[stat.rindex(b")") + 2:].split()
            if fields[0] == b"Z" or int(fields[1]) != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"edgeinfer.runtime.worker_child" in f.read():
                    found.add(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found

def _save(graph: onnx.GraphProto, path: Path, check: bool = True) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if check:
        onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def classifier(path: Path) -> Path:
    """Image [1, 3, 16, 16] -> GlobalAveragePool -> Flatten -> MatMul W -> Softmax [1, 5]."""
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "W"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probs"], axis=1)],
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 5])],
        initializer=[numpy_helper.from_array(W, "W")],
    )
    return _save(graph, path)


def classifier_reference(x: np.ndarray) -> np.ndarray:
    logits = x.mean(axis=(2, 3)) @ W
    e = np.exp(logits - logits.max())
    return np.asarray(e / e.sum(), dtype=np.float32)


def image_identity(path: Path) -> Path:
    """Image [1, 3, 16, 16] -> Relu -> the same 4-D tensor: nothing a classifier can decode."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16, 16])],
    )
    return _save(graph, path)


def sqrt_model(path: Path) -> Path:
    """``y = sqrt(x - 100)``: NaN for any reading below 100."""
    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "c"], ["d"]), helper.make_node("Sqrt", ["d"], ["y"])],
        "sqrt",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[numpy_helper.from_array(np.array(100.0, np.float32), "c")],
    )
    return _save(graph, path)


def huge_expand_model(path: Path, elements: int = 64 * 1024 * 1024) -> Path:
    """Expands its [1, 1] input to [1, elements] floats (256 MiB) before summing it."""
    shape = numpy_helper.from_array(np.array([1, elements], np.int64), "shape")
    graph = helper.make_graph(
        [helper.make_node("Expand", ["x", "shape"], ["big"]),
         helper.make_node("ReduceSum", ["big"], ["y"], keepdims=1)], "oom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        initializer=[shape],
    )
    return _save(graph, path)


def unknown_op_model(path: Path) -> Path:
    """A well-formed ModelProto with an operator no runtime has."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["x"], ["y"])], "unknown",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    return _save(graph, path, check=False)


def pipeline(tmp_path: Path, model: Path, *, task: str = "{type: raw}",
             source: str = "{type: serial, port: /dev/null, window: 4}") -> tuple[PipelineConfig,
                                                                                    Config]:
    """A pipeline decoded from YAML written to a file, as the daemon reads its config."""
    cfg = tmp_path / "edgeinfer.yaml"
    cfg.write_text(f"""\
device_id: test
pipelines:
  - name: p
    model: {{path: {model}, threads: 1}}
    source: {source}
    task: {task}
""")
    config = load_config(cfg)
    return config.pipelines[0], config


def trial(tmp_path: Path, model: Path, **kw: Any) -> VerifyReport:
    task = kw.pop("task", "{type: raw}")
    source = kw.pop("source", "{type: serial, port: /dev/null, window: 4}")
    pc, config = pipeline(tmp_path, model, task=task, source=source)
    return trial_run(model, pc, config.runtime, **kw)


def rejected(reason: str, fn: Any, *args: Any, **kw: Any) -> OtaRejected:
    with pytest.raises(OtaRejected) as info:
        fn(*args, **kw)
    assert info.value.reason == reason, f"{info.value.reason}: {info.value}"
    return info.value


def manifest_of(path: Path, **override: Any) -> dict[str, Any]:
    data = path.read_bytes()
    m: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                         "format": "onnx", "max_model_mb": 64}
    m.update(override)
    return m


# --- check_file ----------------------------------------------------------------------------------


def test_check_file_accepts_a_matching_onnx_and_tflite_file(tmp_path: Path,
                                                            blazeface_path: Path) -> None:
    model = onnx_models.add_model(tmp_path / "add.onnx")
    check_file(model, **manifest_of(model))
    check_file(blazeface_path, **manifest_of(blazeface_path, format="tflite"))


def test_check_file_refuses_a_size_or_sha256_that_differs(tmp_path: Path) -> None:
    model = onnx_models.add_model(tmp_path / "add.onnx")
    m = manifest_of(model)
    err = rejected("size_mismatch", check_file, model, **{**m, "size": m["size"] + 1})
    assert f"{m['size']} bytes" in str(err)
    rejected("sha256_mismatch", check_file, model, **{**m, "sha256": "0" * 64})
    rejected("size_mismatch", check_file, tmp_path / "gone.onnx", **m)


def test_check_file_refuses_a_format_that_is_not_the_declared_one(
        tmp_path: Path, blazeface_path: Path) -> None:
    err = rejected("bad_format", check_file, blazeface_path, **manifest_of(blazeface_path))
    assert "tflite" in str(err)
    text = tmp_path / "model.onnx"
    text.write_text("<html>502 Bad Gateway</html>\n")
    err = rejected("bad_format", check_file, text, **manifest_of(text))
    assert "text file" in str(err)
    model = onnx_models.add_model(tmp_path / "add.onnx")
    rejected("bad_format", check_file, model, **manifest_of(model, format="pt"))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(model.read_bytes()[:-7])
    rejected("bad_format", check_file, truncated, **manifest_of(truncated))


def test_check_file_refuses_external_data_with_or_without_its_file(tmp_path: Path) -> None:
    model = onnx_models.external_data_model(tmp_path / "ext.onnx")
    m = manifest_of(model)
    err = rejected("unsafe_model", check_file, model, **m)
    assert "ext.onnx.data" in str(err)
    (tmp_path / "ext.onnx.data").unlink()  # as it arrives: the pushed file alone
    rejected("unsafe_model", check_file, model, **m)
    escaping = onnx_models.external_data_model(tmp_path / "esc.onnx", location="../x.bin")
    rejected("unsafe_model", check_file, escaping, **manifest_of(escaping))


def test_check_file_refuses_a_file_over_the_limit(tmp_path: Path) -> None:
    model = onnx_models.matmul_model(tmp_path / "mm.onnx", k=256, n=256)  # 256 KiB of weights
    err = rejected("oversize", check_file, model, **manifest_of(model, max_model_mb=0.1))
    assert "max_model_mb=0.1" in str(err)


# --- trial_run: passing --------------------------------------------------------------------------


def test_a_good_classifier_passes_with_its_report(tmp_path: Path) -> None:
    model = classifier(tmp_path / "cls.onnx")
    report = trial(tmp_path, model, task="{type: classify, top_k: 2}",
                   source="{type: synthetic, width: 64, height: 48}", current=model)
    assert report.outputs == {"probs": [1, 5]}
    assert report.provider == "CPUExecutionProvider"
    assert report.speed is not None and report.speed.verdict in ("ok", "inconclusive")
    assert report.baseline_ms == report.speed.current_ms > 0 and report.latency_ms > 0
    assert "task classify decodes" in report.checks
    assert report.checks[0].startswith("loads in an isolated worker")
    assert _worker_children() == set()  # both workers were closed


def test_a_raw_model_on_a_sensor_pipeline_passes(tmp_path: Path) -> None:
    model = onnx_models.add_model(tmp_path / "add.onnx")
    report = trial(tmp_path, model, runs=3)
    assert report.outputs == {"y": [1, 4]}
    assert report.baseline_ms is None and "task raw decodes" in report.checks


def test_golden_outputs_that_match_pass_and_others_are_refused(tmp_path: Path) -> None:
    model = classifier(tmp_path / "cls.onnx")
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)
    args: dict[str, Any] = {"task": "{type: classify}",
                            "source": "{type: synthetic, width: 32, height: 32}"}
    report = trial(tmp_path, model, golden={"x": x, "out:probs": classifier_reference(x)},
                   **args)
    assert "golden (1 inputs, 1 outputs compared)" in report.checks
    assert "task classify decodes" in report.checks  # the task path runs with golden data too

    wrong = classifier_reference(x) + np.float32(0.05)
    err = rejected("golden_mismatch", trial, tmp_path, model,
                   golden={"x": x, "out:probs": wrong}, **args)
    assert "'probs'" in str(err) and "0.05" in str(err)
    rejected("golden_mismatch", trial, tmp_path, model, golden={"image": x}, **args)
    rejected("golden_mismatch", trial, tmp_path, model, golden={"x": x[:, :, :8]}, **args)
    rejected("golden_mismatch", trial, tmp_path, model,
             golden={"x": x, "out:logits": wrong}, **args)


def test_the_real_detector_passes_a_detect_pipeline(tmp_path: Path, yolo_path: Path) -> None:
    report = trial(tmp_path, yolo_path, task=DETECT_TASK, source="{type: synthetic}")
    assert report.outputs == {"output0": [1, 22, 2100]}
    assert "task detect decodes" in report.checks
    # the candidate never lands in the optimized-model cache
    cache = Path(os.environ["EDGEINFER_CACHE_DIR"])
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))


def test_the_real_vad_model_passes_a_vad_pipeline_with_its_state(
        tmp_path: Path, silero_path: Path) -> None:
    report = trial(tmp_path, silero_path, task="{type: vad}",
                   source="{type: audio, path: speech.wav, window: 512}")
    assert report.outputs["output"] == [1, 1] and report.outputs["stateN"] == [2, 1, 128]
    assert "task vad decodes" in report.checks


# --- trial_run: refusals -------------------------------------------------------------------------


def test_a_task_that_cannot_read_the_model_is_refused_undecodable(
        tmp_path: Path, yolo_path: Path) -> None:
    err = rejected("undecodable", trial, tmp_path, image_identity(tmp_path / "id.onnx"),
                   task="{type: classify}", source="{type: synthetic}")
    assert "classify task does not accept the model" in str(err)
    err = rejected("undecodable", trial, tmp_path, yolo_path, task="{type: vad}",
                   source="{type: audio, path: speech.wav}")
    assert "vad task feeds inputs ['input', 'state']" in str(err) and "'images'" in str(err)
    err = rejected("undecodable", trial, tmp_path, classifier(tmp_path / "cls.onnx"),
                   task="{type: detect, decoder: yolov8}", source="{type: synthetic}")
    assert "detect task" in str(err)


def test_outputs_with_nan_are_refused_undecodable(tmp_path: Path) -> None:
    err = rejected("undecodable", trial, tmp_path, sqrt_model(tmp_path / "sqrt.onnx"))
    assert "NaN" in str(err) and "'y'" in str(err)


def test_a_model_the_runtime_refuses_is_load_failed(tmp_path: Path) -> None:
    err = rejected("load_failed", trial, tmp_path, unknown_op_model(tmp_path / "u.onnx"))
    assert "NoSuchOperator" in str(err)


def test_a_model_that_exhausts_the_worker_memory_is_out_of_memory(tmp_path: Path) -> None:
    # onnxruntime's arena fails the 256 MiB allocation under RLIMIT_AS and says so: the worker
    # survives and reports a memory error (ModelMemoryError), no signal involved.
    err = rejected("out_of_memory", trial, tmp_path, huge_expand_model(tmp_path / "oom.onnx"),
                   source="{type: serial, port: /dev/null, window: 1}", memory_limit_mb=64)
    assert "memory_limit_mb=64" in str(err)
    assert _worker_children() == set()


def test_a_worker_that_dies_is_worker_crashed(tmp_path: Path, yolo_path: Path) -> None:
    killed: list[int] = []

    def kill_the_worker() -> None:  # what a segfault in a native runtime looks like to us
        deadline = time.monotonic() + 30
        while not killed and time.monotonic() < deadline:
            for pid in _worker_children():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    try:
        err = rejected("worker_crashed", trial, tmp_path, yolo_path, task=DETECT_TASK,
                       source="{type: synthetic}")
    finally:
        killer.join()
    assert killed and "SIGKILL" in str(err)


class _KillOnLoad(logging.Handler):
    """Kills a worker the moment it reports its model loaded: a crash in the first run."""

    def __init__(self) -> None:
        super().__init__()
        self.killed: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("worker ") and " loaded " in record.getMessage():
            pid = int(record.args[0])  # type: ignore[index, arg-type]
            os.kill(pid, signal.SIGKILL)
            self.killed.append(pid)


def test_a_worker_that_dies_running_the_model_is_worker_crashed(tmp_path: Path) -> None:
    log = logging.getLogger("edgeinfer.runtime.worker")
    handler, level = _KillOnLoad(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        err = rejected("worker_crashed", trial, tmp_path,
                       onnx_models.add_model(tmp_path / "add.onnx"))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert handler.killed and "killed by SIGKILL while running the model" in str(err)


def test_a_candidate_refused_before_the_comparison_leaves_no_worker(
        tmp_path: Path, yolo_path: Path) -> None:
    # the current model loads beside the candidate; a candidate that fails its task check
    # closes both (the speed checks themselves: tests/ota/test_trial_timing.py)
    rejected("undecodable", trial, tmp_path, image_identity(tmp_path / "id.onnx"),
             task="{type: classify}", source="{type: synthetic}", current=yolo_path)
    assert _worker_children() == set()


def test_a_trial_past_its_timeout_is_killed_and_refused(tmp_path: Path, yolo_path: Path) -> None:
    t0 = time.monotonic()
    err = rejected("timeout", trial, tmp_path, yolo_path, task=DETECT_TASK,
                   source="{type: synthetic}", timeout_s=0.2)
    assert time.monotonic() - t0 < 10
    assert "0.2 s" in str(err)
    assert _worker_children() == set()


def test_runs_past_the_timeout_kill_the_loaded_worker(tmp_path: Path) -> None:
    t0 = time.monotonic()
    err = rejected("timeout", trial, tmp_path, onnx_models.add_model(tmp_path / "add.onnx"),
                   timeout_s=2.0, runs=10**9)
    assert 2.0 <= time.monotonic() - t0 < 10
    assert "2 s" in str(err)
    assert _worker_children() == set()
