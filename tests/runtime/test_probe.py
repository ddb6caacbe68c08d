"""The boot probe: cross-check against CPU, keep the fastest, cache the decision.

A second real provider cannot exist on this machine, so the GPU candidates are CPU sessions
wrapped to claim another name, slower or wrong: that is the only fake here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edgeinfer.runtime import onnx as onnx_backend
from edgeinfer.runtime.base import LoadReport, SessionSpec
from edgeinfer.runtime.modelfile import inspect_model
from edgeinfer.runtime.probe import order_by_probe
from edgeinfer.runtime.providers import CPU, Candidate, PlatformInfo
from edgeinfer.testing import onnx_models as om


class _Claimed:
    """A real CPU session that reports ``name`` as its provider, optionally slow or wrong."""

    def __init__(self, sess: Any, name: str, delay: float = 0.0, corrupt: bool = False) -> None:
        self._sess, self._name, self._delay, self._corrupt = sess, name, delay, corrupt

    def get_providers(self) -> list[str]:
        return [self._name, CPU]

    def run(self, names: Any, feeds: Any) -> list[np.ndarray]:
        time.sleep(self._delay)
        out = self._sess.run(names, feeds)
        return [o + 1.0 for o in out] if self._corrupt else out


def _spec(tmp_path: Path) -> SessionSpec:
    path = om.matmul_model(tmp_path / "mm.onnx")
    info = inspect_model(path)
    return SessionSpec(path=path, format="onnx", sha256=info.sha256, threads=1,
                       state_dir=tmp_path / "state", arena="default")


def test_probe_rejects_wrong_keeps_fastest_and_caches(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    calls: list[str] = []

    def create(ort_: Any, spec_: SessionSpec, cand: Candidate, report: LoadReport) -> Any:
        calls.append(cand.name)
        real = onnx_backend._create(ort_, spec_, Candidate(CPU, {}), report)
        if cand.name == "SlowGpuExecutionProvider":
            return _Claimed(real, cand.name, delay=0.003)
        if cand.name == "BrokenGpuExecutionProvider":
            return _Claimed(real, cand.name, corrupt=True)
        return real

    cands = [Candidate("BrokenGpuExecutionProvider", {}), Candidate("SlowGpuExecutionProvider", {}),
             Candidate(CPU, {})]
    report = LoadReport()
    order = order_by_probe(ort, spec, cands, PlatformInfo("x86_64", cpu_model="t"), report, create)
    assert [c.name for c in order] == [CPU, "SlowGpuExecutionProvider"]
    assert "differs from CPU" in report.probe["rejected"]["BrokenGpuExecutionProvider"]
    assert report.probe["cached"] is False
    assert report.probe["median_ms"][CPU] < report.probe["median_ms"]["SlowGpuExecutionProvider"]
    assert [f.provider for f in report.fallbacks] == ["BrokenGpuExecutionProvider"]

    calls.clear()
    again = LoadReport()
    order2 = order_by_probe(ort, spec, cands, PlatformInfo("x86_64", cpu_model="t"), again, create)
    assert [c.name for c in order2] == [CPU, "SlowGpuExecutionProvider"]
    assert again.probe["cached"] is True and calls == []  # a reboot does not re-probe
    # another CPU model is another key: probed afresh
    order_by_probe(ort, spec, cands, PlatformInfo("x86_64", cpu_model="other"), LoadReport(), create)
    assert calls
