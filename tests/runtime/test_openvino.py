"""The OpenVINO backend (``edgeinfer.runtime.openvino``) on the real example models and tiny ones,
checked against onnxruntime and LiteRT on the same inputs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ov = pytest.importorskip("openvino", reason="openvino is not installed (pip install 'edgeinfer[openvino]')")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from edgeinfer.errors import BackendUnavailableError, ModelLoadError, StateError  # noqa: E402
from edgeinfer.runtime.backends import openvino as ovb  # noqa: E402
from edgeinfer.runtime.backends import tflite  # noqa: E402
from edgeinfer.runtime.base import Choice, SessionSpec, check_feeds  # noqa: E402
from edgeinfer.testing import tflite_models as tm  # noqa: E402

YOLO_DIMS = ("batch", 3, "height", "width")
Open = Callable[..., ovb.OpenVinoSession]


@pytest.fixture
def open_ov() -> Iterator[Open]:
    """``open_ov(path, fmt, **spec_fields)``: a session closed at the end of the test."""
    sessions: list[ovb.OpenVinoSession] = []

    def _open(path: Path, fmt: str = "onnx", **kw: Any) -> ovb.OpenVinoSession:
        kw.setdefault("threads", 1)
        session = ovb.open_session(SessionSpec(path=Path(path), format=fmt, sha256="0" * 64, **kw))
        sessions.append(session)
        return session

    yield _open
    for s in sessions:
        s.close()


def _run(session: Any, feeds: Any) -> dict[str, np.ndarray]:
    return dict(session.run(check_feeds(session.inputs, feeds, accept_float_for_quantized=True)))


def _tiny_onnx(path: Path, dims: list[Any]) -> Path:
    """x [dims] -> y = relu(x @ W + b) with known W, b; ``dims`` may hold a named dim."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 7 - 0.8
    b = np.array([0.1, -0.2, 0.3], np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*dims[:-1], 3])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 3], w.ravel().tolist()),
         helper.make_tensor("b", TensorProto.FLOAT, [3], b.tolist())])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_available_version_precisions() -> None:
    assert ovb.available()
    assert ovb.version() == ov.get_version()
    have = ovb.precisions()
    assert have[0] == "fp32" and set(have) <= {"fp32", "bf16", "fp16"}
    caps = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert ("bf16" in have) == ("BF16" in caps)
    assert ovb.precisions("NO_SUCH_DEVICE") == ()


def test_yolo_matches_onnxruntime(yolo_path: Path, open_ov: Open) -> None:
    session = open_ov(yolo_path, threads=2, input_shapes={"images": (1, 3, 320, 320)},
                      graph_inputs={"images": YOLO_DIMS})
    assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [
        ("images", (1, 3, 320, 320), "float32")]
    assert [(s.name, s.dtype) for s in session.outputs] == [("output0", "float32")]
    assert session.provider == "openvino-CPU"
    report = session.report
    assert report.backend == "openvino" and report.choice == Choice("openvino", "CPU", "fp32", 2)
    assert report.warmed_up and report.load_ms > 0
    x = np.random.default_rng(1).uniform(0, 1, (1, 3, 320, 320)).astype(np.float32)
    want = ort.InferenceSession(str(yolo_path), providers=["CPUExecutionProvider"]).run(
        None, {"images": x})[0]
    got = _run(session, x)["output0"]
    assert got.shape == want.shape == (1, 22, 2100)
    # boxes are in pixels (0..320), class scores in 0..1: fp32 agrees to float rounding
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=1e-4)


def test_tiny_model_with_dynamic_batch(tmp_path: Path, open_ov: Open) -> None:
    path = _tiny_onnx(tmp_path / "tiny.onnx", ["n", 4])
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    dynamic = open_ov(path, graph_inputs={"x": ("n", 4)})
    assert dynamic.inputs[0].shape == ("n", 4)  # the file's symbolic name is kept
    fixed = open_ov(path, graph_inputs={"x": ("n", 4)}, input_shapes={"x": (3, 4)})
    assert fixed.inputs[0].shape == (3, 4)
    assert fixed.outputs[0].shape == (3, 3)
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    want = ref.run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(fixed, x)["y"], want, rtol=1e-5, atol=1e-6)
    for n in (1, 5):
        xn = np.random.default_rng(n).normal(size=(n, 4)).astype(np.float32)
        np.testing.assert_allclose(_run(dynamic, xn)["y"], ref.run(None, {"x": xn})[0],
                                   rtol=1e-5, atol=1e-6)


def test_input_shapes_are_checked_like_onnxruntime(tmp_path: Path, open_ov: Open) -> None:
    path = _tiny_onnx(tmp_path / "tiny.onnx", ["n", 4])
    graph = {"x": ("n", 4)}
    with pytest.raises(ModelLoadError, match=r"input_shapes names 'X', but the model's inputs are \['x'\]"):
        open_ov(path, graph_inputs=graph, input_shapes={"X": (1, 4)})
    with pytest.raises(ModelLoadError, match=r"input_shapes\['x'\] has 3 dims, the model's input has 2"):
        open_ov(path, graph_inputs=graph, input_shapes={"x": (1, 4, 1)})
    with pytest.raises(ModelLoadError, match="conflicts with the model's fixed shape"):
        open_ov(path, graph_inputs=graph, input_shapes={"x": (1, 5)})


def test_threads_precision_and_no_pinning_reach_the_compiled_model(
    yolo_path: Path, open_ov: Open
) -> None:
    shapes = {"images": (1, 3, 320, 320)}
    for precision in ovb.precisions():
        choice = Choice("openvino", "CPU", precision, threads=2)
        compiled = open_ov(yolo_path, input_shapes=shapes, choice=choice, warmup=False).compiled
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
        want = {"fp32": ov.Type.f32, "bf16": ov.Type.bf16, "fp16": ov.Type.f16}[precision]
        assert compiled.get_property("INFERENCE_PRECISION_HINT") == want
        assert compiled.get_property("NUM_STREAMS") == 1
        assert compiled.get_property("ENABLE_CPU_PINNING") is False
        assert str(compiled.get_property("PERFORMANCE_HINT")) == "LATENCY"
    one = open_ov(yolo_path, threads=1, input_shapes=shapes, warmup=False)  # no choice: fp32
    assert one.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    assert one.compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


def test_a_precision_the_device_lacks_is_refused(tmp_path: Path, open_ov: Open) -> None:
    path = _tiny_onnx(tmp_path / "tiny.onnx", [1, 4])
    with pytest.raises(ModelLoadError, match="fp32, bf16 or fp16, not 'int8'"):
        open_ov(path, choice=Choice("openvino", "CPU", "int8"))
    with pytest.raises(ModelLoadError, match="cannot infer in fp32.*offers nothing"):
        open_ov(path, choice=Choice("openvino", "NO_SUCH_DEVICE", "fp32"))
    with pytest.raises(ModelLoadError, match="given a litert choice"):
        open_ov(path, choice=Choice("litert", "xnnpack"))


def test_compile_cache_is_filled_then_hit(yolo_path: Path, tmp_path: Path, open_ov: Open) -> None:
    shapes = {"images": (1, 3, 320, 320)}
    cache = tmp_path / "c"
    first = open_ov(yolo_path, input_shapes=shapes, cache_dir=cache)
    assert first.report.cache == "miss"
    blobs = list((cache / "openvino" / "fp32").iterdir())
    assert blobs and all(b.stat().st_size > 0 for b in blobs)
    second = open_ov(yolo_path, input_shapes=shapes, cache_dir=cache)
    assert second.report.cache == "hit"
    assert second.compiled.get_property("LOADED_FROM_CACHE") is True
    x = np.random.default_rng(3).uniform(0, 1, (1, 3, 320, 320)).astype(np.float32)
    np.testing.assert_array_equal(_run(first, x)["output0"], _run(second, x)["output0"])
    # Threads are applied at load: one blob serves every thread count.
    two = open_ov(yolo_path, input_shapes=shapes, cache_dir=cache,
                  choice=Choice("openvino", "CPU", "fp32", 2))
    assert two.report.cache == "hit"
    assert two.compiled.get_property("INFERENCE_NUM_THREADS") == 2


def test_each_precision_runs_as_asked_through_the_cache(
    yolo_path: Path, tmp_path: Path, open_ov: Open
) -> None:
    """OpenVINO's cache key leaves the precision hint out (an f32 blob loaded with an f16 hint
    ran in f32): every precision, cached or not, must give what a fresh compile gives."""
    shapes = {"images": (1, 3, 320, 320)}
    x = np.random.default_rng(5).uniform(0, 1, (1, 3, 320, 320)).astype(np.float32)
    outputs = {}
    for precision in ovb.precisions():
        choice = Choice("openvino", "CPU", precision, 1)
        fresh = _run(open_ov(yolo_path, input_shapes=shapes, choice=choice, warmup=False), x)
        for want_cache in ("miss", "hit"):
            cached = open_ov(yolo_path, input_shapes=shapes, choice=choice, warmup=False,
                             cache_dir=tmp_path / "c")
            assert cached.report.cache == want_cache
            np.testing.assert_array_equal(_run(cached, x)["output0"], fresh["output0"])
        outputs[precision] = fresh["output0"]
    for precision, y in outputs.items():
        if precision != "fp32":  # the reduced precision really ran
            assert not np.array_equal(y, outputs["fp32"]), precision


def test_blazeface_tflite_matches_litert(blazeface_path: Path, open_ov: Open) -> None:
    session = open_ov(blazeface_path, "tflite")
    lite = tflite.open_session(SessionSpec(path=blazeface_path, format="tflite", sha256="0" * 64,
                                           threads=1))
    try:
        assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [
            (s.name, s.shape, s.dtype) for s in lite.inputs]
        assert [s.name for s in session.outputs] == [s.name for s in lite.outputs]
        for seed in range(3):
            x = np.random.default_rng(seed).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
            got, want = _run(session, x), _run(lite, x)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], atol=2e-3, rtol=1e-4)
    finally:
        lite.close()


@pytest.mark.parametrize("make", ["int8_fc", "uint8_add"])
def test_quantized_tflite_behaves_like_litert(make: str, tmp_path: Path, open_ov: Open) -> None:
    path = getattr(tm, f"{make}_model")(tmp_path / f"{make}.tflite")
    session = open_ov(path, "tflite")
    lite = tflite.open_session(SessionSpec(path=path, format="tflite", sha256="0" * 64, threads=1))
    try:
        assert session.inputs == lite.inputs and session.outputs == lite.outputs
        assert session.inputs[0].quantization is not None
        step = session.outputs[0].quantization[0]  # type: ignore[index]
        for x in np.random.default_rng(4).uniform(-1, 1, (10, 1, 4)).astype(np.float32):
            got, want = _run(session, x)["y"], _run(lite, x)["y"]
            assert got.dtype == want.dtype == np.float32
            np.testing.assert_allclose(got, want, atol=step * 1.01)
        raw = open_ov(path, "tflite", dequantize_outputs=False)
        x_q = np.zeros((1, 4), session.inputs[0].dtype)
        assert _run(raw, x_q)["y"].dtype == np.dtype(session.outputs[0].dtype)
    finally:
        lite.close()


def test_corrupt_and_unsupported_models_are_load_errors(
    tmp_path: Path, yolo_path: Path, silero_path: Path, open_ov: Open
) -> None:
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(yolo_path.read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="OpenVINO could not read cut.onnx"):
        open_ov(cut)
    # Silero VAD's If branches have Convs of unknown rank: OpenVINO's ONNX reader refuses it.
    with pytest.raises(ModelLoadError, match="OpenVINO could not read silero_vad.onnx"):
        open_ov(silero_path)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])], "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    strings = tmp_path / "strings.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(strings))
    with pytest.raises(ModelLoadError, match="strings.onnx"):
        open_ov(strings)


def test_outputs_are_copies_and_close_is_idempotent(tmp_path: Path, open_ov: Open) -> None:
    session = open_ov(_tiny_onnx(tmp_path / "tiny.onnx", [1, 4]))
    first = _run(session, np.ones((1, 4), np.float32))["y"]
    kept = first.copy()
    _run(session, np.full((1, 4), 5, np.float32))
    np.testing.assert_array_equal(first, kept)
    session.close()
    session.close()
    with pytest.raises(StateError):
        session.run({"x": np.ones((1, 4), np.float32)})
    with pytest.raises(StateError):
        session.compiled  # noqa: B018


def test_missing_openvino_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    assert not ovb.available()
    with pytest.raises(BackendUnavailableError, match=r"pip install 'edgeinfer\[openvino\]'"):
        ovb.version()


def test_quantized_tflite_without_litert_is_refused(
    tmp_path: Path, blazeface_path: Path, monkeypatch: pytest.MonkeyPatch, open_ov: Open
) -> None:
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    with pytest.raises(ModelLoadError, match="scales only LiteRT reads"):
        open_ov(tm.int8_fc_model(tmp_path / "int8.tflite"), "tflite")
    # a float model needs no scales: OpenVINO runs it alone
    session = open_ov(blazeface_path, "tflite")
    assert [s.name for s in session.outputs] == ["regressors", "classificators"]


def test_importing_openvino_through_edgeinfer_sends_no_telemetry() -> None:
    """`import openvino` sends a usage event to Google Analytics from a forked child unless the
    user opted out; a device must not phone home."""
    import subprocess

    code = ("import sys; from edgeinfer.runtime.backends import openvino as o; o.version(); "
            "import openvino; assert sys.modules.get('openvino_telemetry') is None; "
            "import openvino.tools.ovc.telemetry_utils as t; "
            "print(t.tm.__name__)")
    import os

    env = {k: v for k, v in os.environ.items() if k != "CI"}  # CI=true opts out by itself
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env, check=True)
    assert proc.stdout.strip() == "openvino.tools.ovc.telemetry_stub"
