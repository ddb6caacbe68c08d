"""A backend decision measured under load is measured again by the next load that finds the box
quiet (issue 30, item 7), in a short-lived process too, and ``edgeinfer info`` says whether a
decision is provisional.

The busy side is real: CPU hogs (one per CPU) while a subprocess measures a real model. The
quiet side cannot be real on a test machine shared with other test runs (other processes keep
its CPUs 50-100 % busy): there the load reading (``READER``, from ``/proc``) is given
fixed shares, as ``test_recheck.py`` does for the policy. ``bench/busy_boot.py`` measures the
whole thing on a real quiet box."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.runtime import select
from edgeinfer.runtime.base import SessionSpec
from edgeinfer.runtime.busy import CpuTimes, LoadMeter
from edgeinfer.runtime.decision import Decision
from edgeinfer.statelock import StateLock

sys.path.insert(0, str(Path(__file__).parent))
from test_recheck import X, _chain, _provisional  # the toy backend's helpers

ROOT = Path(__file__).resolve().parents[2]
READER = "edgeinfer.runtime.provisional.read_times"  # what a load reads the load with (/proc)


class Readings:
    """CPU times where other processes use ``shares[i]`` of 2 CPUs in the i-th interval
    between two readings (the last share repeats); our own process idle."""

    def __init__(self, *shares: float) -> None:
        self.shares, self.n, self.total, self.busy = shares, 0, 0, 0

    def __call__(self) -> CpuTimes:
        if self.n:
            share = self.shares[min(self.n - 1, len(self.shares) - 1)]
            self.total += 200
            self.busy += int(200 * share)
        self.n += 1
        return CpuTimes(self.total, self.busy, 0, 0, 2)


def _cache_file(state: Path) -> Path:
    [file] = (state / "select").glob("*.json")
    return file


def _hogs() -> list[subprocess.Popen[bytes]]:
    """One process burning a core per CPU this process may use."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in os.sched_getaffinity(0)]


CHILD = """
import json, sys
import edgeinfer
with edgeinfer.load_model(sys.argv[1], threads=2, state_dir=sys.argv[2],
                          probe_budget_s=float(sys.argv[3])) as m:
    print("RESULT " + json.dumps(m.selection))
"""


def _child_load(path: Path, state: Path, budget_s: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(state), str(budget_s)],
                          capture_output=True, text=True, timeout=300, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    raise AssertionError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")


def test_a_pick_made_under_a_real_hog_is_measured_again_by_the_next_load_on_a_quiet_box(
        blazeface_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    hogs = _hogs()
    try:
        busy = _child_load(blazeface_path, state, 4.0)  # a script's first load, under the hogs
        assert busy["measured_under_load"] is True and busy["provisional"] is True, busy
        assert busy["state"].startswith("provisional: measured under load (other processes "
                                        "used"), busy["state"]
        # `edgeinfer info` on the busy box: says the decision is provisional, measures nothing
        env = {**os.environ, "EDGEINFER_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
        info = subprocess.run([sys.executable, "-m", "edgeinfer", "info", str(blazeface_path),
                               "--threads", "2"], capture_output=True, text=True, env=env,
                              timeout=300, check=False)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert info.returncode == 0, info.stderr[-2000:]
    [line] = [x for x in info.stdout.splitlines() if x.startswith("decision ")]
    assert "provisional: measured under load" in line
    assert "not measured again now: the box is busy now too" in line, line
    file = _cache_file(state)
    before = json.loads(file.read_text())
    assert before["measured_under_load"] is True and before["rechecks"] == 0
    # the next process, on the quiet box (the reading says so: see the module's docstring)
    monkeypatch.setattr(READER, Readings(0.02))
    caplog.set_level(logging.INFO)
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=state,
                              probe_budget_s=4.0) as m:
        sel = m.selection
        assert sel is not None
        out = m.run({m.inputs[0].name: np.zeros(m.inputs[0].shape, np.float32)})
        assert out  # it serves
    assert "the box is quiet now (other processes used 2 % of 2 CPUs): measuring" in caplog.text
    assert "the decision is final" in caplog.text
    assert sel["measured_under_load"] is False and sel["provisional"] is False
    assert sel["state"].startswith("final: measured with other processes at 2 %"), sel["state"]
    assert sel["rechecks"] == 1 and "a load found the box quiet" in sel["recheck"]
    after = json.loads(file.read_text())
    assert after["measured_under_load"] is False and after["picked"] == sel["picked"]
    assert after["created"] > before["created"]
    # final now: the next load opens the pick at once, reads no load, measures nothing
    caplog.clear()
    monkeypatch.setattr(READER, Readings(0.9))
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=state) as m:
        assert m.selection is not None and m.selection["picked"] == sel["picked"]
        assert m.selection["state"].startswith("final")
    assert "measuring" not in caplog.text and "provisional" not in caplog.text


@pytest.fixture
def busy_decision(blazeface_path: Path, tmp_path: Path) -> tuple[SessionSpec, Path]:
    """A real measurement of the model, its load reading busy (60 % of 2 CPUs), cached."""
    state = tmp_path / "state"
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=state, probe=False) as m:
        spec = m._spec.replace(probe=True, probe_budget_s=3.0)
    decision, session = select.measure(spec, budget_s=3.0, meter=LoadMeter(Readings(0.6)))
    assert session is not None
    session.close()
    assert decision.under_load
    decision.key = select.cache_key(spec, "outputs")
    select.store(spec, decision)
    return spec, _cache_file(state)


def test_a_box_busy_again_while_measuring_keeps_the_pick_and_waits_before_the_next_try(
        blazeface_path: Path, busy_decision: tuple[SessionSpec, Path],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    spec, file = busy_decision
    picked = json.loads(file.read_text())["picked"]
    caplog.set_level(logging.INFO)
    # quiet when the load starts, busy (90 %) while it measures
    monkeypatch.setattr(READER, Readings(0.02, 0.9))
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=spec.state_dir,
                              probe_budget_s=3.0) as m:
        sel = m.selection
    assert sel is not None and sel["provisional"] is True and sel["picked"] == picked
    assert "measured again, but the box got busy meanwhile (other processes used 90 %" in \
        sel["state"]
    cached = json.loads(file.read_text())
    assert cached["measured_under_load"] is True and cached["provisional_tries"] == 1
    assert time.time() - 60 < cached["provisional_tried_at"] <= time.time()
    # the box quiet again soon after: no measuring in a loop, the pick serves with a note
    caplog.clear()
    monkeypatch.setattr(READER, Readings(0.02))
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=spec.state_dir) as m:
        sel = m.selection
    assert sel is not None and sel["provisional"] is True
    assert "not measured again now: the last 1 tries ran into load; next try after" in \
        sel["state"]
    assert "measuring" not in caplog.text
    # once min_interval_s has passed (0 here) a quiet load measures it again: final
    monkeypatch.setattr(READER, Readings(0.02))
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=spec.state_dir,
                              probe_budget_s=3.0, recheck={"min_interval_s": 0}) as m:
        sel = m.selection
    assert sel is not None and sel["provisional"] is False, sel["state"]
    assert json.loads(file.read_text())["measured_under_load"] is False


def test_a_load_while_another_process_measures_it_again_serves_the_cached_pick(
        blazeface_path: Path, busy_decision: tuple[SessionSpec, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec, file = busy_decision
    # a cache written before these fields existed reads the same
    old = json.loads(file.read_text())
    for key in ("provisional", "state", "provisional_tries", "provisional_tried_at"):
        del old[key]
    file.write_text(json.dumps(old))
    assert Decision.from_dict(old).under_load
    monkeypatch.setattr(READER, Readings(0.02))
    with StateLock(file.with_suffix(".lock")):  # the other process, measuring it
        with edgeinfer.load_model(blazeface_path, threads=2, state_dir=spec.state_dir) as m:
            sel = m.selection
    assert sel is not None and sel["provisional"] is True and sel["picked"] == old["picked"]
    assert f"not measured again now: pid {os.getpid()} is measuring it again" in sel["state"]
    assert json.loads(file.read_text()) == old  # left to the other process


def test_no_measuring_again_with_rechecks_off(blazeface_path: Path,
                                              busy_decision: tuple[SessionSpec, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    spec, file = busy_decision
    reader = Readings(0.02)
    monkeypatch.setattr(READER, reader)
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=spec.state_dir,
                              recheck=False) as m:
        assert m.selection is not None and m.selection["provisional"] is True
    assert reader.n == 0 and json.loads(file.read_text())["rechecks"] == 0


@pytest.fixture
def toy() -> Iterator[str]:
    from edgeinfer.runtime import backends

    backends.register_backend("toy", "toy_backend", formats=("onnx",), options=("toy_max_nodes",))
    try:
        yield "toy"
    finally:
        del backends.BACKENDS["toy"]


def test_measured_again_at_load_the_fastest_wins_and_serves(
        toy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every candidate was measured: the best few are timed again, interleaved; nothing serves
    # yet, so the truly faster one wins outright (no switch_gain, no stable ranking needed)
    path = _chain(tmp_path / "chain.onnx")
    state = tmp_path / "state"
    file, expected = _provisional(path, state, toy)
    monkeypatch.setattr(READER, Readings(0.02))
    with edgeinfer.load_model(path, providers=[toy], threads=1, state_dir=state) as m:
        assert m.report.choice is not None and m.report.choice.backend == "toy"
        np.testing.assert_allclose(m.run(X)["y"], expected, rtol=1e-4, atol=1e-5)
        sel = m.selection
    assert sel is not None and sel["provisional"] is False
    assert "re-checked (a load found the box quiet" in sel["recheck"]
    assert "switched from onnxruntime" in sel["recheck"]
    cached = json.loads(file.read_text())
    assert cached["choice"]["backend"] == "toy" and cached["measured_under_load"] is False


def test_a_candidate_that_no_longer_opens_leaves_the_pick_serving(
        blazeface_path: Path, busy_decision: tuple[SessionSpec, Path],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    spec, file = busy_decision
    d = json.loads(file.read_text())
    rows = d["candidates"]
    for r in rows:  # every candidate reached: the best few are timed again
        if r["status"] == "skipped":
            r["status"], r["reason"] = "rejected", "edited by the test"
    picked = next(r for r in rows if r["status"] == "picked")
    # a runner-up that cannot open any more (a backend's device gone since)
    gone = {**picked, "status": "ok", "p50_ms": 0.001, "label": "gone",
            "choice": {**picked["choice"], "backend": "openvino", "device": "NO-SUCH-DEVICE"}}
    rows.append(gone)
    file.write_text(json.dumps(d))
    monkeypatch.setattr(READER, Readings(0.02))
    caplog.set_level(logging.INFO)
    with edgeinfer.load_model(blazeface_path, threads=2, state_dir=spec.state_dir) as m:
        sel = m.selection
        assert m.run({m.inputs[0].name: np.zeros(m.inputs[0].shape, np.float32)})
    assert "measuring the backend decision again failed" in caplog.text, caplog.text
    assert sel is not None and sel["provisional"] is True and sel["picked"] == d["picked"]
    assert "not measured again now: measuring it again failed" in sel["state"]
    assert json.loads(file.read_text())["provisional_tries"] == 1  # no retry for a while
