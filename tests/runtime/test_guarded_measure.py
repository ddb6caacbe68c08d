"""A backend candidate that crashes while measured is a refusal, not a dead process (issue 32,
item 5): ``providers: auto`` measures in a child (``runtime/guarded.py``); the candidate that
killed it is refused with the signal's name, the rest are measured again, and the caller's
process keeps running and serves the pick."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ModelLoadError
from edgeinfer.runtime import backends, guarded
from edgeinfer.runtime.base import SessionSpec

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import crash_backend  # noqa: E402,F401  (tests/runtime/crash_backend.py: imported by the child)


@pytest.fixture
def crashy(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("CRASHY_SPARE_PID", str(os.getpid()))
    monkeypatch.delenv("EDGEINFER_MEASURE_IN_PROCESS", raising=False)
    backends.register_backend("crashy", "crash_backend", formats=("onnx",), auto=("onnx",))
    try:
        yield "crashy"
    finally:
        del backends.BACKENDS["crashy"]


def _model(path: Path) -> Path:
    """Two 3x3 convolutions on 16 channels at 96x96: milliseconds, so every backend is measured
    (a model under 0.5 ms is measured on onnxruntime alone)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.1, (16, 16, 3, 3)).astype(np.float32),
                                     f"w{i}") for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


SHAPE = [1, 16, 96, 96]


def _crashy_rows(selection: dict[str, object]) -> list[dict[str, object]]:
    rows = selection["candidates"]
    assert isinstance(rows, list)
    return [r for r in rows if r["choice"]["backend"] == "crashy"]


@pytest.mark.parametrize(("how", "when", "signal_name"), [
    ("segv", "run", "SIGSEGV"), ("abort", "run", "SIGABRT"), ("segv", "open", "SIGSEGV")])
def test_a_candidate_that_crashes_is_refused_and_the_model_loads(
        crashy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, when: str,
        signal_name: str) -> None:
    monkeypatch.setenv("CRASHY_HOW", how)
    monkeypatch.setenv("CRASHY_WHEN", when)
    path = _model(tmp_path / "small.onnx")
    x = np.random.default_rng(1).normal(0, 1, SHAPE).astype(np.float32)
    with edgeinfer.load_model(path, providers="cpu", probe=False) as plain:
        expected = plain.run(x)["y"]
    with edgeinfer.load_model(path, providers="auto", state_dir=tmp_path / "state",
                              probe_budget_s=4) as m:
        assert m.selection is not None
        refused = _crashy_rows(m.selection)
        # each of its candidates (thread counts) crashed a child of its own and was refused
        assert refused and {(r["status"], r["reason"]) for r in refused} == {
            ("rejected", f"crashed ({signal_name}) while measured")}, m.selection
        assert m.selection["choice"]["backend"] != "crashy"
        np.testing.assert_allclose(m.run(x)["y"], expected, rtol=1e-3, atol=1e-4)
    # the refusal is cached with the decision: the next load opens the pick, measuring nothing
    with edgeinfer.load_model(path, providers="auto", state_dir=tmp_path / "state") as again:
        assert again.selection is not None and again.selection.get("cached", True)
        assert _crashy_rows(again.selection)[0]["reason"] == \
            f"crashed ({signal_name}) while measured"


def test_the_crash_is_named_in_the_log(crashy: str, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    path = _model(tmp_path / "small.onnx")
    with caplog.at_level("INFO", logger="edgeinfer"), \
            edgeinfer.load_model(path, providers="auto", state_dir=tmp_path / "state",
                                 probe_budget_s=4):
        pass
    assert "backend candidate crashy CPU fp32 1t crashed (SIGSEGV) while measured: refused" \
        in caplog.text
    # the child's own word reaches this process's handlers, as when measuring here
    said = [r for r in caplog.records if r.name == "edgeinfer.runtime.select"
            and "measuring" in r.getMessage() and "backend candidates" in r.getMessage()]
    assert len(said) >= 2, caplog.text  # one per child: the first died with crashy


def test_a_reference_that_crashes_refuses_the_model(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The format's own backend in fp32 crashing is the model's fault here: refused, loudly."""
    monkeypatch.setenv("CRASHY_SPARE_PID", str(os.getpid()))
    monkeypatch.setenv("CRASHY_WHEN", "open")
    path = _model(tmp_path / "small.onnx")
    # the crashing backend stands in for onnxruntime (the ONNX reference) in the child only
    monkeypatch.setitem(backends.BACKENDS, "onnxruntime", backends.Backend(
        "crash_backend", ("onnx",), "CPUExecutionProvider", ("onnx",)))
    spec = SessionSpec(path=path, format="onnx", sha256="0" * 64, threads=1, probe_budget_s=4)
    with pytest.raises(ModelLoadError, match=r"the process measuring it crashed \(SIGSEGV\) in "
                                             r"its reference configuration \(onnxruntime"):
        guarded.measure_guarded(spec, budget_s=4, keep_winner=False)


def test_more_crashes_than_the_limit_refuse_the_model(
        crashy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guarded, "MAX_CRASHES", 0)
    path = _model(tmp_path / "small.onnx")
    spec = SessionSpec(path=path, format="onnx", sha256="0" * 64, threads=1, probe_budget_s=4)
    with pytest.raises(ModelLoadError, match=r"1 backend candidates crashed while measured "
                                             r"\(crashy CPU fp32 1t: crashed \(SIGSEGV\)"):
        guarded.measure_guarded(spec, budget_s=4, keep_winner=False)


def test_a_child_that_cannot_start_measuring_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that dies before any backend ran (here: Python cannot start it) is not blamed
    on the model's reference configuration."""
    monkeypatch.setattr(guarded.sys, "executable", str(tmp_path / "no-python"))
    path = _model(tmp_path / "small.onnx")
    spec = SessionSpec(path=path, format="onnx", sha256="0" * 64, threads=1, probe_budget_s=4)
    with pytest.raises(ModelLoadError, match="cannot start the process that measures backends"):
        guarded.measure_guarded(spec, budget_s=4, keep_winner=False)
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setattr(guarded.sys, "executable", str(broken))
    with pytest.raises(ModelLoadError, match=r"the process that measures backends exited with "
                                             r"code 3 before measuring"):
        guarded.measure_guarded(spec, budget_s=4, keep_winner=False)
