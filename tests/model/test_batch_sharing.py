"""Pipelines sharing a model run their waiting frames as one batch where the model takes one and
batching measured faster (``model/batching.py``, ``runtime/batching.py``): real models (small
ones built with onnx.helper with a dynamic batch, and YOLOv8n-320), real sessions, real threads.
Measurements are injected where a decision is asserted; no timing is asserted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeinfer.config import Config, parse_config
from edgeinfer.errors import ConfigError, EdgeInferError
from edgeinfer.model import batching
from edgeinfer.model.pool import SharedModel, model_pool
from edgeinfer.pipeline.build import load_pipeline_model
from edgeinfer.runtime.batching import (
    BatchMeasurement,
    BatchPolicy,
    batch_policy,
    decide,
)
from edgeinfer.testing import onnx_models as om

FAST = BatchMeasurement(size=4, single_ms=10.0, batch_ms=20.0, rounds=3)  # 2x
SLOW = BatchMeasurement(size=4, single_ms=10.0, batch_ms=38.0, rounds=3)  # 1.05x


@pytest.fixture(autouse=True)
def _quick_settle(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(batching, "SETTLE_S", 0.0)
    before = len(model_pool())
    yield
    assert len(model_pool()) == before, "the test left a model loaded"


def _save(path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any],
          inits: list[Any]) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def gather_model(path: Path) -> Path:
    """``rows[idx]``: idx [N, 1] int64 -> [N, 1, 4]; an index out of 0..9 makes the run raise."""
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    return _save(path, [helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)],
                 [helper.make_tensor_value_info("idx", TensorProto.INT64, ["N", 1])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 4])], [table])


def summed_model(path: Path) -> Path:
    """x [N, 4] -> the sum over the batch [1, 4]: an output that is not per batch row."""
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    return _save(path, [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [axes])


def _handles(path: Path, n: int, policy: BatchPolicy, **options: Any) -> list[SharedModel]:
    opts = {"probe": False, "threads": 1, **options}
    handles = [model_pool().acquire(path, batch=policy, **opts) for _ in range(n)]
    assert all(isinstance(h, SharedModel) for h in handles)
    return handles  # type: ignore[return-value]


def _together(handles: list[SharedModel], feeds: list[Any]) -> list[Any]:
    """Each handle runs its feeds at the same moment; each one's outputs or error."""
    out: list[Any] = [None] * len(handles)
    start = threading.Barrier(len(handles))

    def one(i: int) -> None:
        start.wait(10)
        try:
            out[i] = handles[i].run(feeds[i])
        except EdgeInferError as exc:
            out[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _until_batched(handles: list[SharedModel], feeds: list[Any],
                   check: Callable[[list[Any]], None], tries: int = 40) -> dict[str, Any]:
    """Run ``feeds`` together until a batch ran (at most ``tries`` rounds, 60 s), checking
    every round's outputs; the batch stats."""
    deadline = time.monotonic() + 60
    for _ in range(tries):
        check(_together(handles, feeds))
        stats: dict[str, Any] = handles[0].shared_stats()["batch"]
        if stats["batches"] > 0 or time.monotonic() > deadline:
            return stats
    return stats


def test_batch_rows_equal_single_runs_on_yolo(yolo_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = [rng.random((1, 3, 320, 320), dtype=np.float32) for _ in range(4)]
    handles = _handles(yolo_path, 4, BatchPolicy(window_ms=50, measurement=FAST))
    try:
        reference = [handles[0].shared.run({"images": x})["output0"] for x in images]

        def same(outs: list[Any]) -> None:
            for got, want in zip(outs, reference, strict=True):
                assert not isinstance(got, Exception), got
                np.testing.assert_allclose(got["output0"], want, rtol=1e-4, atol=1e-3)

        stats = _until_batched(handles, [{"images": x} for x in images], same)
        assert stats["mode"] == "batch" and stats["size"] == 4, stats
        assert stats["batches"] > 0 and stats["failures"] == 0, stats
        assert stats["backend"].startswith("onnxruntime"), stats
    finally:
        for h in handles:
            h.close()


def test_a_bad_frame_costs_only_its_own_pipeline(tmp_path: Path) -> None:
    model = gather_model(tmp_path / "gather.onnx")
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    handles = _handles(model, 3, BatchPolicy(window_ms=50, measurement=FAST),
                       input_shapes={"idx": [1, 1]})
    good = [np.array([[2]], np.int64), np.array([[7]], np.int64)]

    def served(outs: list[Any]) -> None:
        for got, i in zip(outs[:2], (2, 7), strict=True):
            assert not isinstance(got, Exception), got
            np.testing.assert_array_equal(got["y"], table[[i]][None])

    try:
        warm = _until_batched(handles, [*good, np.array([[1]], np.int64)], served)
        assert warm["mode"] == "batch" and warm["batches"] > 0, warm
        for _ in range(20):  # until the bad frame was in a batch (it raised there)
            outs = _together(handles, [*good, np.array([[99]], np.int64)])  # not in the table
            served(outs)
            assert isinstance(outs[2], EdgeInferError), outs[2]
            stats = handles[0].shared_stats()["batch"]
            if stats["failures"]:
                break
        assert stats["failures"] >= 1 and "99" in stats["last_error"], stats
        # a frame of another shape runs on its own: its error is its own, the others are served
        outs = _together(handles, [*good, np.array([[1, 2]], np.int64)])
        served(outs)
        assert isinstance(outs[2], EdgeInferError) and "idx" in str(outs[2])
    finally:
        for h in handles:
            h.close()


def test_a_model_with_a_static_batch_of_one_is_never_batched(tmp_path: Path) -> None:
    model = om.tiny_classifier(tmp_path / "tiny.onnx", size=16)  # image [1, 3, 16, 16]
    for policy in (BatchPolicy(measurement=FAST), batch_policy(4)):
        handles = _handles(model, 2, policy)
        try:
            x = np.zeros((1, 3, 16, 16), np.float32)
            for _ in range(3):
                assert all(not isinstance(o, Exception) for o in _together(handles, [x, x]))
            stats = handles[0].shared_stats()["batch"]
            assert stats["mode"] == "round-robin" and stats["batches"] == 0, stats
            assert "fixed first dimension 1" in stats["reason"], stats
            assert stats["measurement"] is None
        finally:
            for h in handles:
                h.close()


def test_outputs_not_per_batch_row_are_never_batched(tmp_path: Path) -> None:
    model = summed_model(tmp_path / "summed.onnx")
    handles = _handles(model, 2, BatchPolicy(window_ms=50, measurement=FAST),
                       input_shapes={"x": [1, 4]})
    try:
        x = np.ones((1, 4), np.float32)
        deadline = time.monotonic() + 30
        while handles[0].shared_stats()["batch"]["size"] == 0:  # until decided
            assert time.monotonic() < deadline
            for got in _together(handles, [x, x]):
                np.testing.assert_array_equal(got["y"], x)
        stats = handles[0].shared_stats()["batch"]
        assert stats["mode"] == "round-robin" and stats["batches"] == 0, stats
        assert "not the batch" in stats["reason"], stats
    finally:
        for h in handles:
            h.close()


def test_auto_follows_the_measurement(tmp_path: Path) -> None:
    auto = BatchPolicy()
    assert decide(auto, SLOW).batch is False
    assert "1.05x" in decide(auto, SLOW).reason and "under 1.1x" in decide(auto, SLOW).reason
    fast = decide(auto, FAST)
    assert fast.batch and fast.size == 4 and fast.min_frames == 2  # 4 frames cost 2 singles
    three = decide(auto, BatchMeasurement(4, 10.0, 30.0, 3))  # 1.33x: a batch needs 3 frames
    assert three.batch and three.min_frames == 3
    assert decide(batch_policy(4), SLOW).batch  # asked for: used, and the reason says slower
    assert "slower" in decide(batch_policy(4), SLOW).reason
    spotty = BatchMeasurement(4, 10.0, 20.0, 6, faster_rounds=3)  # 2x, but in 3 rounds of 6
    assert not decide(auto, spotty).batch and "3 of 6 rounds" in decide(auto, spotty).reason
    assert decide(auto, BatchMeasurement(4, 10.0, 20.0, 6, faster_rounds=4)).batch
    wrong = BatchMeasurement(4, 10.0, 5.0, 3, max_diff=0.5)  # fast but its rows differ
    assert not decide(auto, wrong).batch and not decide(batch_policy(4), wrong).batch

    model = om.matmul_model(tmp_path / "mm.onnx", batch="N")
    x = np.ones((1, 8), np.float32)
    for measured, mode in ((SLOW, "round-robin"), (FAST, "batch")):
        handles = _handles(model, 2, BatchPolicy(window_ms=50, measurement=measured),
                           input_shapes={"x": [1, 8]})
        try:
            deadline = time.monotonic() + 30
            while handles[0].shared_stats()["batch"]["size"] == 0:
                assert time.monotonic() < deadline
                _together(handles, [x, x])
            stats = handles[0].shared_stats()["batch"]
            assert stats["mode"] == mode, stats
            assert stats["measurement"]["speedup"] == round(measured.speedup, 3)
        finally:
            for h in handles:
                h.close()


def test_auto_goes_back_to_round_robin_when_live_batches_cost_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batching, "LIVE_BATCHES", 3)
    model = om.matmul_model(tmp_path / "mm.onnx", batch="N")
    x = np.ones((1, 8), np.float32)
    # measured 2x, but a single run "took" 1 ns: no live batch can be 1.1x under that
    tiny = BatchMeasurement(2, 1e-6, 1e-6, 3)
    handles = _handles(model, 2, BatchPolicy(window_ms=50, measurement=tiny),
                       input_shapes={"x": [1, 8]})
    try:
        stats = _until_batched(handles, [x, x], lambda outs: None)
        deadline = time.monotonic() + 30
        while stats["mode"] == "batch":
            assert time.monotonic() < deadline, stats
            for got in _together(handles, [x, x]):
                assert not isinstance(got, Exception), got
            stats = handles[0].shared_stats()["batch"]
        assert stats["batches"] == 3 and "live batches of 2 cost" in stats["reason"], stats
        assert stats["live_ms_per_frame"] > 0
        for got in _together(handles, [x, x]):  # served one by one from now on
            np.testing.assert_allclose(got["y"], x @ om.matmul_weights(), rtol=1e-5)
        assert handles[0].shared_stats()["batch"]["batches"] == 3
    finally:
        for h in handles:
            h.close()


def _config(**pipeline: Any) -> Config:
    base = {"name": "a", "source": {"type": "synthetic"}, "sinks": []}
    return parse_config(json.dumps({"pipelines": [{**base, **pipeline}]}))


def test_config_batch_keys_and_stateful_tasks() -> None:
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.model\.batch"):
        _config(model={"path": "m.onnx", "batch": 1})
    with pytest.raises(ConfigError, match=r"pipelines\[0\]\.model\.batch_window_ms"):
        _config(model={"path": "m.onnx", "batch_window_ms": 500})
    with pytest.raises(ConfigError, match=r"model.*batch: 4 needs isolation: none"):
        _config(model={"path": "m.onnx", "batch": 4, "isolation": "process"})
    assert _config(model={"path": "m.onnx", "batch": "off"}).pipelines[0].model.batch == "off"
    config = _config(model={"path": "silero-vad", "batch": 4, "probe": False},
                     source={"type": "audio", "command": "true"}, task={"type": "vad"})
    handles = [load_pipeline_model(config.pipelines[0], config.runtime) for _ in range(2)]
    try:
        assert handles[0].shared is handles[1].shared  # type: ignore[attr-defined]
        stats = handles[0].shared_stats()["batch"]  # type: ignore[attr-defined]
        assert stats["mode"] == "round-robin" and "stateful" in stats["reason"], stats
    finally:
        for h in handles:
            h.close()
