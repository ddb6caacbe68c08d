"""load_model on ONNX models: equal to raw onnxruntime, INT8 styles, bad input, memory, caches."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnx.helper
import onnxruntime as ort
import pytest

import edgeinfer
from edgeinfer.errors import (
    ConfigError,
    InvalidInputError,
    ModelFormatError,
    ModelLoadError,
    ModelMemoryError,
    ProviderFallbackError,
    StateError,
)
from edgeinfer.runtime.memory import process_budget
from edgeinfer.testing import onnx_models as om

YOLO_SHAPE = {"images": (1, 3, 320, 320)}


@pytest.fixture
def image() -> np.ndarray:
    return np.random.default_rng(7).random((1, 3, 320, 320), dtype=np.float32)


def raw_run(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_yolo_matches_raw_onnxruntime(yolo_path: Path, image: np.ndarray) -> None:
    with edgeinfer.load_model(yolo_path, threads=2, input_shapes=YOLO_SHAPE,
                              providers="cpu") as m:
        assert m.provider == "CPUExecutionProvider"
        assert m.format == "onnx" and m.quantization == "float"
        assert [(s.name, s.shape, s.dtype) for s in m.inputs] == [
            ("images", (1, 3, 320, 320), "float32")]
        assert [(s.name, s.shape) for s in m.outputs] == [("output0", (1, 22, 2100))]
        assert m.report.warmed_up and m.report.warmup_ms > 0
        out = m.run({"images": image})
        bare = m.run(image)  # one input: a bare array is accepted
    expected = raw_run(yolo_path, {"images": image})[0]
    np.testing.assert_allclose(out["output0"], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(out["output0"], bare["output0"])


def test_threads_and_small_device_session_options(yolo_path: Path) -> None:
    with edgeinfer.load_model(yolo_path, threads=1, input_shapes=YOLO_SHAPE, probe=False) as m:
        so = m._session._sess.get_session_options()
        assert so.intra_op_num_threads == 1 and so.inter_op_num_threads == 1
        assert so.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert so.get_session_config_entry("session.inter_op.allow_spinning") == "0"


def test_dynamic_shapes_without_input_shapes_skip_warmup_with_a_note(
    yolo_path: Path, image: np.ndarray, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # the example model without its size in the metadata (imgsz), outside the models cache:
    # no size known (a copy of the same bytes is the example model, sized as it is)
    mine = tmp_path / "mine.onnx"
    model = onnx.load(yolo_path)
    props = {p.key: p.value for p in model.metadata_props if p.key != "imgsz"}
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, props)
    onnx.save(model, mine)
    with caplog.at_level(logging.WARNING), edgeinfer.load_model(mine) as m:
        assert not m.report.warmed_up
        assert "give its real sizes: --input-shape images=" in m.report.warmup_note
        assert m.inputs[0].shape == ("batch", 3, "height", "width")
        assert m.run(image)["output0"].shape == (1, 22, 2100)
    assert "warm-up skipped" in caplog.text


@pytest.mark.arm64
@pytest.mark.parametrize("signed", [True, False], ids=["s8s8", "u8s8"])
def test_qdq_int8_equals_numpy_reference(tmp_path: Path, signed: bool) -> None:
    path = om.qdq_matmul_model(tmp_path / "qdq.onnx", signed_activations=signed)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8)).astype(np.float32)
    with edgeinfer.load_model(path) as m:
        assert m.quantization == "int8-qdq"
        y = m.run(x)["y"]
    np.testing.assert_allclose(y, om.qdq_matmul_reference(x, signed=signed), atol=1e-5)


@pytest.mark.arm64
def test_float_and_other_int8_styles_close_to_float_reference(tmp_path: Path) -> None:
    x = np.random.default_rng(2).uniform(-1, 1, (1, 8)).astype(np.float32)
    ref = x @ om.matmul_weights()
    cases = [(om.matmul_model, "float", 1e-6), (om.qoperator_matmul_model, "int8-qoperator", 0.1),
             (om.dynamic_int8_model, "int8-dynamic", 0.05)]
    for builder, style, tol in cases:
        with edgeinfer.load_model(builder(tmp_path / f"{style}.onnx")) as m:
            assert m.quantization == style
            np.testing.assert_allclose(m.run(x)["y"], ref, atol=tol)


def test_multi_input_and_wrong_inputs_say_what_was_expected(tmp_path: Path) -> None:
    a = np.ones((1, 3), np.float32)
    with edgeinfer.load_model(om.two_input_model(tmp_path / "two.onnx")) as m:
        out = m.run({"a": a, "b": 2 * a, "k": np.array(3, np.int64)})
        np.testing.assert_array_equal(out["sum"], 3 * a)
        np.testing.assert_array_equal(out["scaled"], 6 * a)
        with pytest.raises(InvalidInputError, match="3 inputs"):
            m.run(a)
        with pytest.raises(InvalidInputError, match=r"missing \['k'\].*unknown \['c'\]"):
            m.run({"a": a, "b": a, "c": a})
        with pytest.raises(InvalidInputError, match=r"'a': expected shape \[1, 3\], got \(1, 4\)"):
            m.run({"a": np.ones((1, 4), np.float32), "b": a, "k": np.array(1)})
        with pytest.raises(InvalidInputError, match="expected dtype float32, got float64"):
            m.run({"a": a.astype(np.float64), "b": a, "k": np.array(1)})
        with pytest.raises(InvalidInputError, match=r"expected shape \[1, 3\] \(2 dims\)"):
            m.run({"a": a[0], "b": a, "k": np.array(1)})
        with pytest.raises(InvalidInputError, match="dict of name"):
            m.run([a, a])  # type: ignore[arg-type]
        # the model still works after refused input
        assert m.run({"a": a, "b": a, "k": 2})["scaled"].tolist() == [[2.0, 2.0, 2.0]]


def test_closed_model_raises_state_error_and_close_is_idempotent(tmp_path: Path) -> None:
    m = edgeinfer.load_model(om.add_model(tmp_path / "add.onnx"))
    m.close()
    m.close()
    assert m.closed
    with pytest.raises(StateError, match="closed"):
        m.run(np.zeros((1, 4), np.float32))
    with pytest.raises(StateError):
        _ = m.provider


def test_bad_files_and_arguments(tmp_path: Path, yolo_path: Path) -> None:
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(yolo_path.read_bytes()[:5000])
    with pytest.raises(ModelFormatError):
        edgeinfer.load_model(cut)
    with pytest.raises(ConfigError, match="isolation"):
        edgeinfer.load_model(yolo_path, isolation="thread")
    with pytest.raises(ConfigError, match="threads"):
        edgeinfer.load_model(yolo_path, threads=0)
    with pytest.raises(ModelLoadError, match="input_shapes names 'image'"):
        edgeinfer.load_model(yolo_path, input_shapes={"image": (1, 3, 320, 320)})
    with pytest.raises(ModelLoadError, match="conflicts with the model's fixed shape"):
        edgeinfer.load_model(om.add_model(tmp_path / "a.onnx"), input_shapes={"x": (2, 4)})


def test_a_model_valid_as_protobuf_but_refused_by_onnxruntime(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelLoadError, match="onnxruntime could not load bad.onnx"):
        edgeinfer.load_model(path)


def test_memory_limit_refuses_with_numbers_and_disturbs_nothing(
    tmp_path: Path, yolo_path: Path, image: np.ndarray
) -> None:
    small = edgeinfer.load_model(om.add_model(tmp_path / "add.onnx"), name="small")
    used_before = process_budget().used_mb
    with pytest.raises(ModelMemoryError, match=r"costs \d+\.\d MiB .* over its memory_limit_mb=1"):
        edgeinfer.load_model(yolo_path, memory_limit_mb=1, input_shapes=YOLO_SHAPE)
    assert process_budget().used_mb == used_before
    assert small.run(np.zeros((1, 4), np.float32))["y"].tolist() == [[1, 1, 1, 1]]
    small.close()


def test_process_budget_admits_by_measured_cost(tmp_path: Path, yolo_path: Path) -> None:
    budget = process_budget()
    held = budget.used_mb  # models other tests in this process still hold (an xdist worker)
    try:
        first = edgeinfer.load_model(yolo_path, input_shapes=YOLO_SHAPE, name="first")
        cost = budget.used_mb - held
        assert cost > 5  # weights (12 MB file) and the first run's activations
        edgeinfer.set_memory_budget(held + cost + 1)
        with pytest.raises(ModelMemoryError, match="process budget .*memory_budget_mb"):
            edgeinfer.load_model(yolo_path, input_shapes=YOLO_SHAPE, name="second")
        assert budget.used_mb == pytest.approx(held + cost)
        assert not first.closed and first.run(np.zeros((1, 3, 320, 320), np.float32))
        first.close()
        assert budget.used_mb == pytest.approx(held)
    finally:
        edgeinfer.set_memory_budget(None)


def test_optimized_model_cache_hit_and_torn_entry(
    tmp_path: Path, yolo_path: Path, image: np.ndarray
) -> None:
    # probe=False: one session opened per load (measuring candidates may open the pick twice,
    # the second time from the entry the first wrote)
    kw = {"input_shapes": YOLO_SHAPE, "cache_dir": tmp_path / "c", "providers": "cpu",
          "probe": False}
    with edgeinfer.load_model(yolo_path, **kw) as m:
        assert m.report.cache == "miss"
        first = m.run(image)["output0"]
    entries = list((tmp_path / "c" / "onnx").glob("*.onnx"))
    assert len(entries) == 1
    with edgeinfer.load_model(yolo_path, **kw) as m:
        assert m.report.cache == "hit"
        np.testing.assert_allclose(m.run(image)["output0"], first, rtol=1e-5, atol=1e-4)
    entries[0].write_bytes(entries[0].read_bytes()[:1000])  # power cut while writing
    with edgeinfer.load_model(yolo_path, **kw) as m:
        assert m.report.cache == "miss"
        np.testing.assert_allclose(m.run(image)["output0"], first, rtol=1e-5, atol=1e-4)
    with edgeinfer.load_model(yolo_path, optimized_model_cache=False, **kw) as m:
        assert m.report.cache == "off"


def test_unavailable_provider_is_a_recorded_fallback_or_an_error(tmp_path: Path) -> None:
    path = om.add_model(tmp_path / "add.onnx")
    with edgeinfer.load_model(path, providers=["cuda", "cpu"]) as m:
        assert m.provider == "CPUExecutionProvider"
        assert [f.provider for f in m.report.fallbacks] == ["CUDAExecutionProvider"]
        assert m.info()["fallbacks"][0]["reason"] == "not available in this onnxruntime build"
    with pytest.raises(ProviderFallbackError, match="CUDAExecutionProvider"):
        edgeinfer.load_model(path, providers="cuda", strict_providers=True)


def test_info_describes_model_and_session(tmp_path: Path) -> None:
    with edgeinfer.load_model(om.qdq_matmul_model(tmp_path / "q.onnx"), version="1.2") as m:
        info = m.info()
    assert info["quantization"] == "int8-qdq" and info["opset"] == 17
    assert info["version"] == "1.2" and info["name"] == "q"
    assert info["inputs"] == [{"name": "x", "shape": [1, 8], "dtype": "float32"}]
    assert len(info["sha256"]) == 64 and info["size_bytes"] > 0
    assert info["session"]["warmed_up"] is True
    assert info["graph"]["op_types"]["QuantizeLinear"] == 1


def test_a_config_model_section_loads_as_configured(tmp_path: Path, yolo_path: Path) -> None:
    from edgeinfer.config import parse_config

    cfg = parse_config(
        f"pipelines:\n  - name: det\n    source: {{type: synthetic}}\n    model:\n"
        f"      path: {yolo_path}\n      threads: 1\n"
        "      version: '2.0'\n      providers: [cuda, cpu]\n"
        "      input_shapes: {images: [1, 3, 320, 320]}\n", base_dir=tmp_path)
    mc = cfg.pipelines[0].model
    kwargs = mc.load_kwargs(default_max_model_mb=cfg.runtime.max_model_mb)
    with edgeinfer.load_model(mc.path, **kwargs) as m:
        assert m.version == "2.0" and m.inputs[0].shape == (1, 3, 320, 320)
        assert m.report.warmed_up and m.report.fallbacks[0].provider == "CUDAExecutionProvider"


def test_process_isolation_through_load_model(yolo_path: Path, image: np.ndarray) -> None:
    import os
    import signal

    from edgeinfer.errors import WorkerCrashed

    with edgeinfer.load_model(yolo_path, isolation="process", memory_limit_mb=256,
                              input_shapes=YOLO_SHAPE, threads=1, providers="cpu") as m:
        assert m.report.isolation == "process" and m.report.warmed_up
        assert m.provider == "CPUExecutionProvider" and m.quantization == "float"
        assert process_budget().used_mb >= m.report.rss_first_run_mb > 5  # the worker's cost
        out = m.run(image)["output0"]
        np.testing.assert_allclose(out, raw_run(yolo_path, {"images": image})[0],
                                   rtol=1e-4, atol=1e-3)
        os.kill(m._session.pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashed, match="SIGKILL"):
            m.run(image)
        m.restart()
        np.testing.assert_array_equal(m.run(image)["output0"], out)
    with edgeinfer.load_model(yolo_path, input_shapes=YOLO_SHAPE) as in_process:
        with pytest.raises(StateError, match="isolation='process'"):
            in_process.restart()


def test_external_data_model_loads_and_is_not_cached(tmp_path: Path) -> None:
    path = om.external_data_model(tmp_path / "ext.onnx", k=64, n=64)
    x = np.random.default_rng(5).uniform(-1, 1, (1, 64)).astype(np.float32)
    for _ in range(2):  # an optimized copy would duplicate the weights on the device's storage
        with edgeinfer.load_model(path, cache_dir=tmp_path / "c") as m:
            assert m.report.cache == "off"
            np.testing.assert_allclose(m.run(x)["y"], x @ om.matmul_weights(64, 64), atol=1e-5)


def test_silero_vad_stateful_model_matches_raw(silero_path: Path) -> None:
    rng = np.random.default_rng(6)
    state = np.zeros((2, 1, 128), np.float32)
    raw_state = state
    sr = np.array(16000, np.int64)
    shapes = {"input": (1, 512), "state": (2, 1, 128)}
    # sr=0 is no valid rate: the zero-feed warm-up is skipped with a note, the model still loads
    with edgeinfer.load_model(silero_path, input_shapes=shapes) as m:
        assert not m.report.warmed_up and "give warmup_inputs" in m.report.warmup_note
        assert m.run({"input": np.zeros((1, 512), np.float32), "state": state, "sr": sr})
    with pytest.raises(ModelLoadError, match="given warmup_inputs"):  # real values that fail
        edgeinfer.load_model(silero_path, input_shapes=shapes,
                             warmup_inputs={"input": 0.0, "state": 0.0, "sr": 0})
    with edgeinfer.load_model(silero_path, input_shapes=shapes, warmup_inputs={"sr": 16000}) as m:
        assert m.report.warmed_up
        for _ in range(3):  # state carried between windows, as the VAD task will
            audio = rng.uniform(-0.5, 0.5, (1, 512)).astype(np.float32)
            out = m.run({"input": audio, "state": state, "sr": sr})
            ref = raw_run(silero_path, {"input": audio, "state": raw_state, "sr": sr})
            np.testing.assert_allclose(out["output"], ref[0], atol=1e-5)
            np.testing.assert_allclose(out["stateN"], ref[1], atol=1e-5)
            state, raw_state = out["stateN"], ref[1]
