"""RawTask: frames of each kind in, output tensors out as rounded nested lists."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgeinfer
from edgeinfer.config.pipeline import PreprocessConfig, RawTask as RawConfig
from edgeinfer.errors import InvalidInputError
from edgeinfer.frames import Frame
from edgeinfer.tasks import make_task
from edgeinfer.tasks.raw import RawTask
from edgeinfer.testing.onnx_models import add_model


def _pool_model(path: Path) -> Path:
    """images [1, 3, 8, 8] -> per-channel mean [1, 3] and the int64 shape of the input."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images"], ["mean"], axes=[2, 3], keepdims=0),
         helper.make_node("Shape", ["images"], ["shape"])],
        "pool",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, [1, 3]),
         helper.make_tensor_value_info("shape", TensorProto.INT64, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _result(task: RawTask, frame: Frame) -> dict:
    feeds, ctx = task.preprocess(frame)
    result = task.postprocess(task.model.run(feeds), frame, ctx)
    msgspec.json.encode(result.to_dict())  # serializable as it is
    assert result.outputs is not None
    return result.outputs


def test_audio_and_series_frames_feed_the_single_input(tmp_path: Path) -> None:
    with edgeinfer.load_model(add_model(tmp_path / "add.onnx", shape=(1, 4))) as m:
        task = make_task(RawConfig(), m)
        audio = Frame(0, 0.0, 0.0, np.array([0.1, -0.25, 1 / 3, 0.0], np.float32), kind="audio",
                      sample_rate=16000, start=0.0)
        assert _result(task, audio) == {"y": [[1.1, 0.75, 1.333333, 1.0]]}  # type: ignore[arg-type]
        series = Frame(1, 0.0, 0.0, np.array([[1, 2], [3, 4]], np.float32), kind="series",
                       fields=("a", "b"))
        assert _result(task, series) == {"y": [[2.0, 3.0, 4.0, 5.0]]}  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match=r"\(3,\) does not fit input x \[1, 4\]"):
            task.preprocess(Frame(2, 0.0, 0.0, np.zeros(3, np.float32), kind="audio"))


def test_image_frames_are_preprocessed_for_an_image_input(tmp_path: Path) -> None:
    with edgeinfer.load_model(_pool_model(tmp_path / "pool.onnx")) as m:
        task = RawTask(RawConfig(), m)
        assert task.preprocessor is not None
        frame = Frame(0, 0.0, 0.0, np.full((16, 16, 3), (0, 51, 255), np.uint8))
        out = _result(task, frame)
        assert out == {"mean": [[1.0, 0.2, 0.0]], "shape": [1, 3, 8, 8]}
        bgr = RawTask(RawConfig(preprocess=PreprocessConfig(color="bgr", scale=1.0)), m)
        assert _result(bgr, frame)["mean"] == [[0.0, 51.0, 255.0]]
