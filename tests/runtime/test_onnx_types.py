"""ONNX models onnxruntime loads, edgeinfer loads: warm-ups that zeros break, every dtype
onnxruntime takes, strings, sequences, and ``dim_value: -1`` as a dynamic dimension."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

import edgeinfer
from edgeinfer.errors import InferenceError, InvalidInputError, ModelLoadError
from edgeinfer.runtime.base import TensorSpec, check_feeds
from edgeinfer.runtime.modelfile import inspect_model


def _save(path: Path, nodes: list, inputs: list, outputs: list, opset: int = 21) -> Path:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path.write_bytes(model.SerializeToString())
    return path


def _io(name: str, dtype: int, shape: list) -> object:
    return helper.make_tensor_value_info(name, dtype, shape)


def _identity(path: Path, dtype: int, shape: list | None = None) -> Path:
    shape = [2] if shape is None else shape
    return _save(path, [helper.make_node("Identity", ["x"], ["y"])],
                 [_io("x", dtype, shape)], [_io("y", dtype, shape)])


def test_a_warmup_that_zeros_break_is_skipped_and_the_model_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # integer Mod: a zero divisor is no valid input, and every dimension is declared
    path = _save(tmp_path / "mod.onnx", [helper.make_node("Mod", ["a", "b"], ["y"])],
                 [_io("a", T.INT64, [3]), _io("b", T.INT64, [3])], [_io("y", T.INT64, [3])])
    with caplog.at_level(logging.WARNING), edgeinfer.load_model(path, threads=1) as m:
        assert not m.report.warmed_up and "refused zeros for ['a', 'b']" in m.report.warmup_note
        assert "warmup_inputs" in m.report.warmup_note
        out = m.run({"a": np.array([7, 8, 9]), "b": np.array([4, 3, 2])})["y"]
    np.testing.assert_array_equal(out, [3, 2, 1])
    assert "warm-up skipped" in caplog.text
    # with real values given for every input, the warm-up runs, and a failure of those is real
    with edgeinfer.load_model(path, warmup_inputs={"a": 1, "b": 3}) as m:
        assert m.report.warmed_up
    with pytest.raises(ModelLoadError, match="given warmup_inputs"):
        edgeinfer.load_model(path, warmup_inputs={"a": 1, "b": 0})

@pytest.mark.parametrize(("onnx_type", "np_type"), [(T.UINT32, np.uint32), (T.UINT64, np.uint64)])
def test_unsigned_32_and_64_bit_inputs(tmp_path: Path, onnx_type: int, np_type: type) -> None:
    path = _save(tmp_path / "add.onnx", [helper.make_node("Add", ["x", "x"], ["y"])],
                 [_io("x", onnx_type, [3])], [_io("y", onnx_type, [3])])
    with edgeinfer.load_model(path) as m:
        assert m.inputs[0].dtype == np.dtype(np_type).name and m.report.warmed_up
        x = np.array([1, 2, 2**31], np_type)
        np.testing.assert_array_equal(m.run(x)["y"], x + x)
        with pytest.raises(InvalidInputError, match=f"expected dtype {np.dtype(np_type).name}"):
            m.run(x.astype(np.int64))


def test_string_inputs_as_object_or_str_arrays(tmp_path: Path) -> None:
    path = _save(tmp_path / "concat.onnx", [helper.make_node("StringConcat", ["x", "x"], ["y"])],
                 [_io("x", T.STRING, [2])], [_io("y", T.STRING, [2])], opset=20)
    with edgeinfer.load_model(path) as m:
        assert m.inputs[0].dtype == "str" and m.report.warmed_up
        for x in (np.array(["ab", "ç"], dtype=object), np.array(["ab", "ç"], dtype=np.str_)):
            assert list(m.run(x)["y"]) == ["abab", "çç"]
        assert list(m.run({"x": ["ab", "c"]})["y"]) == ["abab", "cc"]
        with pytest.raises(InvalidInputError, match=r"dtype=object\) or dtype=np.str_") as err:
            m.run(np.array([1, 2]))
        assert "np.str)" not in str(err.value)  # numpy 2 has no np.str


def test_bfloat16_and_float8_load_and_refuse_numpy_types_with_typed_errors(
    tmp_path: Path
) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for onnx_type, name in ((T.BFLOAT16, "bfloat16"), (T.FLOAT8E4M3FN, "float8_e4m3fn")):
        with edgeinfer.load_model(_identity(tmp_path / f"{name}.onnx", onnx_type)) as m:
            assert m.inputs[0].dtype == name
            with pytest.raises(InvalidInputError, match=f"expected dtype {name}"):
                m.run(np.zeros(2, np.float32))
            # onnxruntime's Python API takes no ml_dtypes array: a typed error, not a TypeError
            if not m.report.warmed_up:
                assert f"the runtime took no {name} arrays" in m.report.warmup_note
                with pytest.raises(InferenceError):
                    m.run(np.zeros(2, getattr(ml_dtypes, name)))


def test_check_feeds_never_lets_a_numpy_type_error_escape() -> None:
    for dtype in ("uint32", "uint64", "bfloat16", "int4", "str", "float4_e2m1fn"):
        specs = (TensorSpec("x", (2,), dtype),)
        with pytest.raises(InvalidInputError):
            check_feeds(specs, {"x": object()})
        with pytest.raises(InvalidInputError, match=f"expected (dtype {dtype}|strings)") as err:
            check_feeds(specs, {"x": np.zeros(2, np.float64)})
        hint = "ml_dtypes." if dtype in ("bfloat16", "int4", "float4_e2m1fn") else "np."
        assert dtype == "str" or f".astype({hint}{dtype})" in str(err.value)
        if dtype != "str":  # ragged: numpy's ValueError, typed
            with pytest.raises(InvalidInputError, match="cannot be made"):
                check_feeds(specs, {"x": [[1, 2], [3]]})


def test_sequence_inputs_are_passed_through(tmp_path: Path) -> None:
    seq = helper.make_tensor_sequence_value_info
    path = _save(tmp_path / "seq.onnx", [helper.make_node("SequenceLength", ["x"], ["n"])],
                 [seq("x", T.FLOAT, None)], [_io("n", T.INT64, [])])
    with edgeinfer.load_model(path) as m:
        assert m.inputs[0].dtype == "seq(tensor(float))"
        assert not m.report.warmed_up and "no warm-up value" in m.report.warmup_note
        assert int(m.run({"x": [np.zeros(2, np.float32)] * 3})["n"]) == 3


def test_dim_value_minus_one_is_a_dynamic_dimension(tmp_path: Path) -> None:
    path = _identity(tmp_path / "paddle.onnx", T.FLOAT, [-1, 3, -1])  # as Paddle2ONNX writes
    assert inspect_model(path).onnx.inputs == {"x": (None, 3, None)}
    with edgeinfer.load_model(path, input_shapes={"x": (2, 3, 5)}) as m:
        assert m.inputs[0].shape == (2, 3, 5) and m.report.warmed_up
        assert m.run(np.ones((2, 3, 5), np.float32))["y"].shape == (2, 3, 5)
    with edgeinfer.load_model(path) as m:
        assert m.inputs[0].shape == (None, 3, None)
        assert m.run(np.ones((4, 3, 1), np.float32))["y"].shape == (4, 3, 1)
