"""The ONNX backend test suite shipped in the ``onnx`` package, through ``load_model`` with defaults.

Every model that raw onnxruntime loads and runs to the suite's expected outputs (within the
suite's own rtol/atol) must load through ``edgeinfer.load_model`` and give the same outputs.
Models raw onnxruntime refuses or gets wrong are not edgeinfer's to fix and are left out.
One session per model, ``threads=1``. Run as a script for a per-category summary.

Each model is measured (``load_model``'s defaults), which makes the suite minutes long: the test
runs it in ``SHARDS`` parts (every ``SHARDS``-th model), each its own xdist group, so that the
workers share it; together they run every model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import edgeinfer  # noqa: E402
from edgeinfer.errors import EdgeInferError  # noqa: E402

DIR_KINDS = ("simple", "pytorch-converted", "pytorch-operator")
SHARDS = 4

Case = tuple[str, str, Any, list[tuple[list[np.ndarray], list[np.ndarray]]], float, float]


def _read_pb(path: Path) -> np.ndarray:
    from onnx import numpy_helper

    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def _dir_data(model_dir: Path) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    sets = []
    for d in sorted(model_dir.glob("test_data_set_*")):
        ins = [_read_pb(p) for p in sorted(d.glob("input_*.pb"), key=_index)]
        outs = [_read_pb(p) for p in sorted(d.glob("output_*.pb"), key=_index)]
        sets.append((ins, outs))
    return sets


def _index(p: Path) -> int:
    return int(p.stem.rsplit("_", 1)[1])


def cases() -> Iterator[Case]:
    """(kind, name, ModelProto or model path, data sets, rtol, atol) for every suite model."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the node generators' own numpy overflow warnings
        node = load_model_tests(kind="node")
    from onnx.backend.test import runner

    norm = getattr(runner, "_normalize_tensor", lambda t: t)  # data sets may hold TensorProtos
    for c in node:
        sets = [([norm(t) for t in ins], [norm(t) for t in outs]) for ins, outs in c.data_sets or []]
        yield "node", c.name, c.model, sets, c.rtol, c.atol
    for kind in DIR_KINDS:
        for c in load_model_tests(kind=kind):
            model_dir = Path(c.model_dir)
            yield kind, c.name, model_dir / "model.onnx", _dir_data(model_dir), c.rtol, c.atol


def _same(got: list[Any], want: list[Any], rtol: float, atol: float) -> str:
    """The suite's own comparison (``Runner.assert_similar_outputs``): shape, dtype, tolerance;
    strings and sequences element by element."""
    from onnx.backend.test.runner import Runner

    try:
        Runner.assert_similar_outputs(want, got, rtol, atol)
    except (AssertionError, TypeError) as exc:
        return " ".join(str(exc).split())[:200]
    return ""


def _array(value: Any) -> Any:
    """A numpy scalar as a 0-d array: onnxruntime's ``run`` takes no ``np.float32(1.0)`` (its
    backend wrapper converts them; ``load_model`` gets them as the suite has them)."""
    return np.asarray(value) if isinstance(value, np.generic) else value


def _raw(path: Path, sets: list[Any], rtol: float, atol: float) -> bool:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        outs = [o.name for o in sess.get_outputs()]
        return all(
            len(ins) == len(names)
            and not _same(sess.run(outs, dict(zip(names, map(_array, ins)))), want, rtol, atol)
            for ins, want in sets
        )
    except Exception:  # raw onnxruntime cannot run it: not a case edgeinfer must pass
        return False


def _edgeinfer(path: Path, sets: list[Any], rtol: float, atol: float, tmp: Path) -> str:
    try:
        with edgeinfer.load_model(path, threads=1, cache_dir=tmp / "cache",
                                  state_dir=tmp / "state") as m:
            names = [s.name for s in m.inputs]
            for ins, want in sets:
                out = m.run(dict(zip(names, ins)))
                bad = _same([out[s.name] for s in m.outputs], want, rtol, atol)
                if bad:
                    return bad
    except EdgeInferError as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # anything outside the error tree is a defect of its own
        return f"untyped {type(exc).__name__}: {exc}"[:300]
    return ""


def run_suite(tmp: Path, shard: int = 0, shards: int = 1) -> tuple[int, dict[str, str], dict[str, int]]:
    """Returns (models raw onnxruntime passes, {name: why edgeinfer failed}, passes per kind)
    for every ``shards``-th suite model from the ``shard``-th (default: all of them)."""
    models = tmp / "models"
    models.mkdir(parents=True, exist_ok=True)
    passed = 0
    failed: dict[str, str] = {}
    per_kind: dict[str, int] = {}
    for i, (kind, name, model, sets, rtol, atol) in enumerate(cases()):
        if i % shards != shard:
            continue
        if isinstance(model, Path):
            path = model
        else:
            path = models / f"{name}.onnx"
            path.write_bytes(model.SerializeToString())
        if not sets or not _raw(path, sets, rtol, atol):
            continue
        passed += 1
        per_kind[kind] = per_kind.get(kind, 0) + 1
        why = _edgeinfer(path, sets, rtol, atol, tmp)
        if why:
            failed[f"{kind}/{name}"] = why
    return passed, failed, per_kind


@pytest.mark.parametrize("shard", [
    pytest.param(i, marks=[pytest.mark.slow, pytest.mark.xdist_group(f"onnx-conformance-{i}")])
    for i in range(SHARDS)])
def test_every_model_onnxruntime_runs_runs_through_load_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, shard: int
) -> None:
    caplog.set_level(logging.ERROR, logger="edgeinfer")
    passed, failed, per_kind = run_suite(tmp_path, shard, SHARDS)
    # the suite is real: a broken loader (no cases) must not pass by default (1,688 models and
    # over 10 of each kind in all, so over 1000 / SHARDS and some of each kind in each part)
    assert passed > 1000 // SHARDS and all(
        per_kind.get(k, 0) >= 10 // SHARDS for k in ("node", *DIR_KINDS)), per_kind
    assert not failed, f"{len(failed)} of {passed} fail through load_model:\n" + "\n".join(
        f"{k}: {v}" for k, v in sorted(failed.items()))


if __name__ == "__main__":
    import sys
    import tempfile
    from collections import Counter

    logging.basicConfig(level=logging.ERROR)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        n, bad, kinds = run_suite(Path(d))
    print(f"raw onnxruntime passes {n} {kinds}; {len(bad)} fail through load_model; "
          f"{time.perf_counter() - t0:.1f} s")
    why = Counter(v.split(":")[0] + ": " + (v.split(":")[1][:60] if ":" in v else "")
                  for v in bad.values())
    for k, v in why.most_common(30):
        print(v, k)
    if "-v" in sys.argv:
        for k, v in sorted(bad.items()):
            print(k, "|", v[:200])
