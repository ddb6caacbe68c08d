"""``WorkerSession``: a real worker subprocess running the real ONNX backend."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import psutil
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeinfer.errors import (
    EdgeInferError,
    InferenceError,
    ModelLoadError,
    ModelMemoryError,
    StateError,
    WorkerCrashed,
    WorkerCrashedError,
)
from edgeinfer.runtime import SessionSpec
from edgeinfer.runtime.worker import WorkerSession
from edgeinfer.testing.onnx_models import OPSET, add_model, matmul_model, two_input_model

MakeWorker = Callable[..., WorkerSession]


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def fill_model(path: Path) -> Path:
    """``y = ones(shape)``: as much memory as the ``shape`` input asks for, at run time."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], value=one)],
        "fill",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    return _save(graph, path)


def gather_model(path: Path) -> Path:
    """``y = data[idx]`` over 3 values: an index out of range fails inside the kernel."""
    data = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], dtype=np.float32), "data")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["data", "idx"], ["y"])],
        "gather",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        initializer=[data],
    )
    return _save(graph, path)


def loop_model(path: Path) -> Path:
    """``v = n * 1.0`` by a ``Loop`` of ``n`` iterations: as slow as ``n`` says."""
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, []),
        ],
        initializer=[one],
    )
    v0 = numpy_helper.from_array(np.array(0.0, dtype=np.float32), "v0")
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "v0"], ["v"], body=body)],
        "loop",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [])],
        initializer=[v0],
    )
    return _save(graph, path)


def spec_for(path: Path, **changes: Any) -> SessionSpec:
    return SessionSpec(path=path, format="onnx", sha256="0" * 64, threads=1).replace(**changes)


def reference(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def memfds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "edgeinfer-worker" in target:
            found.append(target)
    return found


@pytest.fixture
def make_worker() -> Iterator[MakeWorker]:
    made: list[WorkerSession] = []

    def make(path: Path, memory_limit_mb: float | None = None, **kw: Any) -> WorkerSession:
        spec_changes = kw.pop("spec", {})
        worker = WorkerSession(spec_for(path, **spec_changes), memory_limit_mb, **kw)
        made.append(worker)
        return worker

    yield make
    for worker in made:
        worker.close()


def workers() -> list[psutil.Process]:
    """Our child processes that are edgeinfer workers (a session's mosquitto is not one)."""
    return [p for p in psutil.Process().children()
            if "edgeinfer.runtime.worker" in " ".join(p.cmdline())]


@pytest.fixture(scope="module", autouse=True)
def no_leftovers() -> Iterator[None]:
    """No worker outlives its test; no file of ours ever appears in /dev/shm (the worker maps a
    memfd). Other programs' segments come and go meanwhile: PostgreSQL's dynamic shared memory
    (``PostgreSQL.<n>``, a cluster another test or the machine runs) is not ours to count."""
    def ours() -> set[str]:
        return {n for n in os.listdir("/dev/shm") if not n.startswith("PostgreSQL.")}

    shm_before = ours()
    yield
    assert ours() == shm_before
    assert workers() == []
    assert memfds() == []


def test_matches_in_process_onnxruntime(tmp_path: Path, make_worker: MakeWorker) -> None:
    path = matmul_model(tmp_path / "mm.onnx")
    worker = make_worker(path, memory_limit_mb=64)
    x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)[:1, ::2]
    assert not x.flags.c_contiguous
    out = worker.run({"x": x})
    np.testing.assert_array_equal(out["y"], reference(path, {"x": np.ascontiguousarray(x)})["y"])
    assert [t.name for t in worker.inputs] == ["x"] and worker.inputs[0].shape == (1, 8)
    assert worker.provider == "CPUExecutionProvider"
    assert worker.report.isolation == "process" and worker.report.warmed_up
    assert worker.report.rss_load_mb > 0
    assert worker.quantization == "unknown"
    assert worker.alive and worker.pid != os.getpid()


def test_tflite_model_in_a_worker(tmp_path: Path) -> None:
    tflite_models = pytest.importorskip("edgeinfer.testing.tflite_models")
    pytest.importorskip("ai_edge_litert")
    path = tflite_models.add_model(tmp_path / "add.tflite")
    spec = spec_for(path, format="tflite")
    with WorkerSession(spec, memory_limit_mb=64) as worker:
        x = np.array([[0.5, 1.0, -2.0, 3.0]], dtype=np.float32)
        np.testing.assert_array_equal(worker.run({"x": x})["y"], tflite_models.add_reference(x))
        assert worker.quantization == "float"
        assert worker.report.isolation == "process"
    assert not worker.alive


def test_mixed_dtypes_and_int64_scalar(tmp_path: Path, make_worker: MakeWorker) -> None:
    path = two_input_model(tmp_path / "two.onnx")
    worker = make_worker(path)
    feeds = {
        "a": np.array([[1.0, 2.0, 3.0]], dtype=np.float32),
        "b": np.array([[0.5, -1.0, 4.0]], dtype=np.float32),
        "k": np.array(3, dtype=np.int64),
    }
    for _ in range(3):  # the region is reused call after call
        out = worker.run(feeds)
        want = reference(path, feeds)
        assert out.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(out[name], want[name])
            assert out[name].dtype == want[name].dtype


def test_large_tensors_grow_the_region(tmp_path: Path, make_worker: MakeWorker) -> None:
    path = add_model(tmp_path / "add.onnx", shape=(1, 3, 320, 320))
    worker = make_worker(path)
    before = worker.region_bytes
    x = np.random.default_rng(2).random((1, 3, 320, 320), dtype=np.float32)
    out = worker.run({"x": x})
    assert worker.region_bytes > before >= 0
    assert worker.region_bytes >= 2 * x.nbytes  # inputs then outputs, side by side
    np.testing.assert_array_equal(out["y"], x + 1)
    size = worker.region_bytes
    out2 = worker.run({"x": x * 2})
    assert worker.region_bytes == size
    np.testing.assert_array_equal(out2["y"], x * 2 + 1)
    np.testing.assert_array_equal(out["y"], x + 1)  # earlier results are copies, not views


def test_concurrent_runs_are_serialized(tmp_path: Path, make_worker: MakeWorker) -> None:
    path = matmul_model(tmp_path / "mm.onnx")
    worker = make_worker(path)
    xs = [np.full((1, 8), i, dtype=np.float32) for i in range(4)]
    wants = [reference(path, {"x": x})["y"] for x in xs]
    failures: list[BaseException] = []

    def hammer(i: int) -> None:
        try:
            for _ in range(50):
                np.testing.assert_array_equal(worker.run({"x": xs[i]})["y"], wants[i])
        except Exception as exc:
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_sigkill_is_reported_and_restart_recovers(tmp_path: Path, make_worker: MakeWorker) -> None:
    path = matmul_model(tmp_path / "mm.onnx")
    worker = make_worker(path)
    x = np.ones((1, 8), dtype=np.float32)
    want = worker.run({"x": x})["y"]
    pid = worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError, match=rf"worker {pid} killed by SIGKILL"):
        worker.run({"x": x})
    assert not worker.alive
    with pytest.raises(WorkerCrashed):  # and again, until restarted
        worker.run({"x": x})
    worker.restart()
    assert worker.alive and worker.pid != pid
    np.testing.assert_array_equal(worker.run({"x": x})["y"], want)


def test_worker_exit_is_reported(tmp_path: Path, make_worker: MakeWorker) -> None:
    worker = make_worker(matmul_model(tmp_path / "mm.onnx"))
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGTERM)
    with pytest.raises(WorkerCrashedError, match="SIGTERM"):
        worker.run({"x": np.ones((1, 8), dtype=np.float32)})


def test_memory_limit_contains_a_hungry_model(tmp_path: Path, make_worker: MakeWorker) -> None:
    worker = make_worker(fill_model(tmp_path / "fill.onnx"), memory_limit_mb=64)
    small = worker.run({"shape": np.array([1000], dtype=np.int64)})
    assert small["y"].shape == (1000,)
    with pytest.raises((ModelMemoryError, WorkerCrashedError), match="memory_limit_mb=64"):
        worker.run({"shape": np.array([512 << 18], dtype=np.int64)})  # 512 MiB of float32
    if worker.alive:  # an allocation failure is an error, not a crash: it keeps serving
        assert worker.run({"shape": np.array([10], dtype=np.int64)})["y"].shape == (10,)
    other = make_worker(add_model(tmp_path / "add.onnx"), memory_limit_mb=64)
    np.testing.assert_array_equal(other.run({"x": np.zeros((1, 4), np.float32)})["y"], 1)


def test_run_error_is_typed_and_worker_keeps_serving(
    tmp_path: Path, make_worker: MakeWorker
) -> None:
    worker = make_worker(gather_model(tmp_path / "gather.onnx"))
    pid = worker.pid
    with pytest.raises(InferenceError, match="out of") as info:
        worker.run({"idx": np.array([7], dtype=np.int64)})
    assert not isinstance(info.value, WorkerCrashedError)
    assert any("worker process" in note for note in info.value.__notes__)
    out = worker.run({"idx": np.array([2], dtype=np.int64)})
    np.testing.assert_array_equal(out["y"], [3.0])
    assert worker.pid == pid


def test_load_error_is_typed(tmp_path: Path, make_worker: MakeWorker) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not a model")
    with pytest.raises(ModelLoadError):
        make_worker(bad)
    assert workers() == []


def test_run_timeout_kills_the_worker(tmp_path: Path, make_worker: MakeWorker) -> None:
    worker = make_worker(loop_model(tmp_path / "loop.onnx"), run_timeout_s=0.5)
    assert worker.run({"n": np.array(10, dtype=np.int64)})["v"] == 10.0
    pid = worker.pid
    t0 = time.monotonic()
    with pytest.raises(WorkerCrashedError, match=rf"worker {pid} timed out after 0.5 s"):
        worker.run({"n": np.array(10**12, dtype=np.int64)})
    assert time.monotonic() - t0 < 30  # not the 10**12 iterations: the timeout ended it
    assert not worker.alive and not psutil.pid_exists(pid)
    worker.restart()
    assert worker.run({"n": np.array(3, dtype=np.int64)})["v"] == 3.0


def test_interrupted_run_retires_the_worker(tmp_path: Path, make_worker: MakeWorker) -> None:
    worker = make_worker(loop_model(tmp_path / "loop.onnx"))

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            worker.run({"n": np.array(10**12, dtype=np.int64)})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # A late reply must never answer the next call.
    assert not worker.alive
    with pytest.raises(WorkerCrashedError, match="interrupted"):
        worker.run({"n": np.array(2, dtype=np.int64)})
    worker.restart()
    assert worker.run({"n": np.array(2, dtype=np.int64)})["v"] == 2.0


def test_start_timeout(tmp_path: Path, make_worker: MakeWorker) -> None:
    with pytest.raises(WorkerCrashedError, match="timed out .* loading"):
        make_worker(matmul_model(tmp_path / "mm.onnx"), start_timeout_s=0.01)


def test_close_is_idempotent_and_final(tmp_path: Path, make_worker: MakeWorker) -> None:
    worker = make_worker(matmul_model(tmp_path / "mm.onnx"))
    pid = worker.pid
    assert memfds()  # ours, and the duplicate mmap keeps
    worker.close()
    worker.close()
    assert not worker.alive and worker.pid is None
    assert not psutil.pid_exists(pid)
    assert memfds() == []
    with pytest.raises(StateError):
        worker.run({"x": np.ones((1, 8), dtype=np.float32)})
    with pytest.raises(StateError):
        worker.restart()


def test_close_interrupts_a_hung_run(tmp_path: Path, make_worker: MakeWorker) -> None:
    worker = make_worker(loop_model(tmp_path / "loop.onnx"))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run({"n": np.array(10**12, dtype=np.int64)})
        except EdgeInferError as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    worker.close()
    t.join(10)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], StateError)


def test_killed_worker_leaves_nothing_in_dev_shm(tmp_path: Path, make_worker: MakeWorker) -> None:
    before = set(os.listdir("/dev/shm"))
    worker = make_worker(add_model(tmp_path / "add.onnx", shape=(1, 3, 64, 64)))
    worker.run({"x": np.zeros((1, 3, 64, 64), np.float32)})
    assert set(os.listdir("/dev/shm")) == before
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    with pytest.raises(WorkerCrashedError):
        worker.run({"x": np.zeros((1, 3, 64, 64), np.float32)})
    worker.close()
    assert set(os.listdir("/dev/shm")) == before


def test_worker_nice_and_timeout_through_load_model(tmp_path: Path) -> None:
    import edgeinfer

    with edgeinfer.load_model(add_model(tmp_path / "m.onnx"), isolation="process",
                              worker_nice=5, worker_timeout_s=30) as m:
        pid = m.worker_pid
        assert pid is not None and pid != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 5
        assert m.run(np.ones((1, 4), np.float32))["y"].tolist() == [[2.0] * 4]
    with edgeinfer.load_model(add_model(tmp_path / "m.onnx")) as m:
        assert m.worker_pid is None  # in-process
