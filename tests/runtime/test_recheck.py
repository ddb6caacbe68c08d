"""Backend decisions that survive a busy first boot (issue 25, item 6): the load read from /proc,
interleaved timing until the ranking is stable, the re-check policy on a fake clock, and a real
re-check that swaps a serving model's session between runs."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.errors import ConfigError
from edgeinfer.runtime import backends, select, timing
from edgeinfer.runtime.base import Choice, LoadReport, SessionSpec, TensorSpec
from edgeinfer.runtime.busy import CpuTimes, Load, LoadMeter, RecheckSettings, load_between, \
    read_times
from edgeinfer.runtime.decision import Decision, Row
from edgeinfer.runtime.memory import process_budget
from edgeinfer.runtime.recheck import RecheckPolicy, Watch
from edgeinfer.runtime.remeasure import recheck_choices, remeasure
from edgeinfer.runtime.timing import Cancelled, pick, time_interleaved
from edgeinfer.testing import onnx_models as om

sys.path.insert(0, str(Path(__file__).parent))
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

CPU = "CPUExecutionProvider"


# -- the load ------------------------------------------------------------------------------------
def test_the_load_is_other_processes_share_of_our_cpus(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    me = tmp_path / "self"
    cpus = sorted(__import__("os").sched_getaffinity(0))
    lines = ["cpu  1 1 1 1 1 1 1 1 0 0"]
    for c in cpus:  # user nice system idle iowait irq softirq steal
        lines.append(f"cpu{c} 100 0 50 800 10 0 0 40 0 0")
    lines.append(f"cpu{max(cpus) + 1} 9999 0 0 0 0 0 0 0 0 0")  # not ours: not counted
    stat.write_text("\n".join(lines) + "\nintr 1 2 3\n")
    me.write_text("42 (py thon) S " + " ".join(["0"] * 10) + " 30 20 0 0 20 0\n")
    t = read_times(str(stat), str(me))
    assert t == CpuTimes(total=1000 * len(cpus), busy=150 * len(cpus), steal=40 * len(cpus),
                         own=50, cpus=len(cpus))
    later = CpuTimes(t.total + 1000, t.busy + 600, t.steal + 50, t.own + 100, t.cpus)
    load = load_between(t, later)
    assert load is not None
    assert load.others == pytest.approx((600 - 100 + 50) / 1000)  # our own time is not load
    assert load.steal == pytest.approx(0.05)
    assert load_between(t, t) is None
    assert "55 %" in load.describe() and "steal 5 %" in load.describe()
    assert read_times(str(tmp_path / "missing"), str(me)) is None


def test_the_real_proc_reading_works_here() -> None:
    meter = LoadMeter()
    sum(i * i for i in range(200_000))  # our own work: not other processes' load
    load = meter.read()
    if load is not None:  # Linux
        assert 0.0 <= load.others <= 1.0 and load.cpus >= 1


class FakeTimes:
    """CPU times that advance by ``others`` of the CPUs per call (our own process idle)."""

    def __init__(self, others: float, cpus: int = 2) -> None:
        self.others, self.cpus, self.n = others, cpus, 0

    def __call__(self) -> CpuTimes:
        self.n += 1
        total = 100 * self.cpus * self.n
        return CpuTimes(total, int(total * self.others), 0, 0, self.cpus)


# -- settings ------------------------------------------------------------------------------------
def test_settings_refuse_what_cannot_work_naming_the_field() -> None:
    assert RecheckSettings.of(None) == RecheckSettings()
    assert RecheckSettings.of(False).enabled is False
    assert RecheckSettings.of({"idle_for_s": 5}).idle_for_s == 5
    with pytest.raises(ConfigError, match=r"recheck: unknown field\(s\) idle"):
        RecheckSettings.of({"idle": 5})
    with pytest.raises(ConfigError, match=r"recheck\.idle_share: a share of the CPUs"):
        RecheckSettings.of({"idle_share": 2})
    with pytest.raises(ConfigError, match=r"recheck\.switch_gain: a ratio above 1"):
        RecheckSettings.of({"switch_gain": 0.9})


def test_the_yaml_knobs_are_checked_with_their_path() -> None:
    from edgeinfer.config.loader import parse_config

    text = """
pipelines:
  - name: cam
    source: {type: images, uri: .}
    model:
      path: m.onnx
      recheck: {idle_for_s: 10, drift_ratio: %s}
"""
    config = parse_config(text % "2.0")
    kwargs = config.pipelines[0].model.load_kwargs()
    assert kwargs["recheck"]["idle_for_s"] == 10 and kwargs["recheck"]["drift_ratio"] == 2.0
    assert RecheckSettings.of(kwargs["recheck"]).drift_ratio == 2.0
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[0\]\.model\.recheck\.drift_ratio"):
        parse_config(text % "0.5")


# -- the policy on a fake clock --------------------------------------------------------------------
IDLE, BUSY = Load(0.02, 0.0, 2), Load(0.5, 0.0, 2)


def _policy(provisional: bool = True, **changes: float) -> RecheckPolicy:
    settings = RecheckSettings(**{"after_s": 60.0, "idle_for_s": 30.0, "min_interval_s": 300.0,
                                  "drift_for_s": 60.0, **changes})
    return RecheckPolicy(settings, started=0.0, measured_ms=10.0, provisional=provisional)


def test_a_provisional_decision_is_rechecked_after_the_box_was_idle_long_enough() -> None:
    p = _policy()
    # idle from the start, but never in the first 60 s
    assert [p.tick(t, IDLE, 10.0) for t in range(5, 60, 5)] == [None] * 11
    assert p.tick(60, IDLE, 10.0) == "idle"
    assert p.running and p.count == 1
    assert p.tick(65, IDLE, 10.0) is None  # one at a time
    p.done(8.0, provisional=False)
    assert p.measured_ms == 8.0 and not p.provisional
    assert all(p.tick(t, IDLE, 8.0) is None for t in range(70, 1000, 5))  # settled


def test_busy_moments_restart_the_idle_wait() -> None:
    p = _policy()
    got = []
    for t in range(5, 200, 5):
        # busy until 90 but for one idle reading at 80: idle from 90 on, due at 120 (30 s)
        load = BUSY if t <= 90 and t != 80 else IDLE
        got.append((t, p.tick(t, load, 10.0)))
    assert [t for t, trig in got if trig] == [120]


def test_a_quiet_decision_is_not_rechecked_without_drift_and_drift_rechecks_any() -> None:
    p = _policy(provisional=False)
    assert all(p.tick(t, IDLE, 12.0) is None for t in range(5, 400, 5))  # 1.2x: no drift
    # 1.6x in the readings from 400 on, which cover the time since the tick at 395
    fired = [t for t in range(400, 600, 5) if p.tick(t, BUSY, 16.0)]
    assert fired == [455]


def test_rechecks_are_bounded_in_count_and_spacing() -> None:
    p = _policy(max_rechecks=2, min_interval_s=100.0)
    fired = []
    for t in range(5, 2000, 5):
        trig = p.tick(t, IDLE, 10.0)
        if trig:
            fired.append(t)
            p.done(None, provisional=True)  # still provisional: it may come again
    assert fired == [60, 160]


def test_the_watch_polls_at_most_every_poll_s_with_the_window_median() -> None:
    now = [0.0]
    seen: list[float | None] = []

    class Spy(RecheckPolicy):
        def tick(self, t: float, load: Load | None, live: float | None) -> str | None:
            seen.append(live)
            return None

    watch = Watch(Spy(RecheckSettings(), started=0.0, measured_ms=1.0, provisional=True),
                  poll_s=5.0, clock=lambda: now[0], meter=LoadMeter(FakeTimes(0.0)))
    due = []
    for i in range(100):
        now[0] = i * 0.1
        if watch.record(float(i % 7)):
            due.append(now[0])
            watch.poll()
    assert due == [pytest.approx(5.0)]
    assert seen == [3.0]


# -- interleaved timing ---------------------------------------------------------------------------
class SleepySession:
    """A session whose run takes ``ms`` (sleeping: its cost does not depend on the CPUs)."""

    def __init__(self, ms: float, log: list[str], name: str) -> None:
        self.ms, self.log, self.name = ms, log, name
        self.inputs = (TensorSpec("x", (1,), "float32"),)
        self.outputs = (TensorSpec("y", (1,), "float32"),)
        self.report = LoadReport(provider=name)

    @property
    def provider(self) -> str:
        return self.name

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.log.append(self.name)
        time.sleep(self.ms / 1000)
        return {"y": np.zeros(1, np.float32)}

    def close(self) -> None:
        pass


class FakeClock:
    """``perf_counter`` for ``runtime.timing``, moved on only by ``ClockedSession`` runs: the
    timings are exactly the sessions' (a sleep on a loaded box oversleeps by milliseconds)."""

    def __init__(self) -> None:
        self.now = time.perf_counter()

    def perf_counter(self) -> float:
        return self.now


class ClockedSession(SleepySession):
    def __init__(self, ms: float, log: list[str], name: str, clock: FakeClock) -> None:
        super().__init__(ms, log, name)
        self.clock = clock

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.log.append(self.name)
        self.clock.now += self.ms / 1000
        return {"y": np.zeros(1, np.float32)}


def test_interleaved_rounds_rotate_and_stop_when_the_pick_is_stable() -> None:
    log: list[str] = []
    rows = [Row(Choice("onnxruntime", CPU, threads=t), "ok") for t in (1, 2, 3)]
    sessions = [(r, SleepySession(ms, log, n)) for r, ms, n in zip(rows, (6.0, 1.0, 12.0), "ABC")]
    stable = time_interleaved(sessions, {"x": np.zeros(1, np.float32)},
                              time.perf_counter() + 60)
    assert stable
    blocks = [log[i] for i in range(3, len(log), 6)]  # after one untimed run each
    assert blocks[:9] == list("ABCBCACAB")  # A B C, B C A, C A B
    assert all(r.final and r.runs == len(log[3:]) // 3 * 5 // 6 for r in rows)
    assert pick(rows) is rows[1]
    assert len(log) < 3 + 3 * 6 * 20  # stopped once stable, long before the deadline


def test_interleaved_timing_cancelled_before_a_round_raises_cancelled_and_keeps_the_rows(
        ) -> None:
    # A model closed while its re-check was starting: not a StatisticsError ("no median for
    # empty data", logged as a failed re-check), and the rows keep their earlier numbers.
    log: list[str] = []
    rows = [Row(Choice("onnxruntime", CPU, threads=t), "ok", ms) for t, ms in ((1, 6.0), (2, 1.0))]
    sessions = [(r, SleepySession(r.p50_ms or 0.0, log, n)) for r, n in zip(rows, "AB")]
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        time_interleaved(sessions, {"x": np.zeros(1, np.float32)}, time.perf_counter() + 60,
                         cancel)
    assert [r.p50_ms for r in rows] == [6.0, 1.0] and not any(r.final for r in rows)


def test_the_recheck_times_the_pick_and_the_best_of_each_thread_count() -> None:
    def row(t: int, ms: float, status: str = "ok", backend: str = "onnxruntime") -> Row:
        return Row(Choice(backend, CPU if backend == "onnxruntime" else "CPU", threads=t),
                   status, ms)

    rows = [row(1, 10.0, "picked"), row(1, 10.5), row(1, 10.8, backend="openvino"),
            row(2, 14.0), row(2, 9.0, "rejected", backend="openvino")]
    decision = Decision(rows[0].choice, rows, "outputs", "", under_load=True)
    chosen = recheck_choices(decision)
    assert chosen[0] == rows[0].choice
    assert rows[3].choice in chosen  # 2 threads looked slow under load: timed again
    assert rows[4].choice not in chosen and len(chosen) <= 4


def test_a_decision_says_it_was_measured_under_load(tmp_path: Path) -> None:
    path = om.add_model(tmp_path / "add.onnx")
    with edgeinfer.load_model(path, probe=False, state_dir=tmp_path / "s") as m:
        spec: SessionSpec = m._spec.replace(probe=True)
    decision, session = select.measure(spec, budget_s=1.0, meter=LoadMeter(FakeTimes(0.5)))
    assert session is not None
    session.close()
    assert decision.under_load and decision.load is not None
    assert decision.load.others == pytest.approx(0.5)
    d = decision.to_dict()
    assert d["measured_under_load"] is True and d["load"]["others"] == 0.5
    again = Decision.from_dict(json.loads(json.dumps(d)))
    assert again.under_load and again.load == decision.load
    assert "measured under load (other processes used 50 % of 2 CPUs): provisional" in \
        again.summary()
    quiet, s2 = select.measure(spec, budget_s=1.0, meter=LoadMeter(FakeTimes(0.01)))
    assert s2 is not None
    s2.close()
    assert not quiet.under_load and "under load" not in quiet.summary()


# -- end to end: a provisional pick re-checked and swapped between runs ----------------------------
NODES = 300  # onnxruntime runs each node; the toy backend folds them into one multiply-add


@pytest.fixture
def toy() -> Iterator[str]:
    backends.register_backend("toy", "toy_backend", formats=("onnx",), options=("toy_max_nodes",))
    try:
        yield "toy"
    finally:
        del backends.BACKENDS["toy"]


def _chain(path: Path) -> Path:
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range(NODES):
        op = "Add" if i % 2 == 0 else "Mul"
        value = rng.normal(0, 0.01, (1, 64)) if op == "Add" else 1 + rng.normal(0, 0.001, (1, 64))
        inits.append(numpy_helper.from_array(value.astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node(op, [current, f"c{i}"], [f"t{i}"]))
        current = f"t{i}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "chain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _provisional(path: Path, state: Path, toy: str, measured_ms: float = 5.0
                 ) -> tuple[Path, np.ndarray]:
    """Cache what a busy first boot could have decided: onnxruntime picked, the toy (truly ~100x
    faster) looking slower, measured under load. Returns the decision file and the reference
    output for ``X``."""
    with edgeinfer.load_model(path, providers=[toy], threads=1, state_dir=state,
                              probe=False) as m:
        spec = m._spec.replace(probe=True)
        expected = m.run(X)["y"]
    ort = select.reference_choice(spec)
    [toy_choice] = [c for c in select.candidates(spec)[0] if c.backend == toy]
    decision = Decision(ort, [Row(ort, "picked", measured_ms, accuracy="reference"),
                              Row(toy_choice, "ok", 50.0, accuracy="cosine 1.000000")],
                        "outputs", "seeded random inputs", load=Load(0.5, 0.0, 2),
                        under_load=True)
    decision.key = select.cache_key(spec, "outputs")
    select.store(spec, decision)
    [file] = (state / "select").glob("*.json")
    return file, expected


X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)


@pytest.fixture
def busy_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loads find the box busy (all of it: over any busy_share), so a load serves a provisional
    pick as it is rather than measuring it again (``test_provisional.py``) and the serving
    model's re-check is what these tests see; the model's own load readings stay real."""
    monkeypatch.setattr("edgeinfer.runtime.provisional.read_times", FakeTimes(1.0))


def test_a_provisional_pick_is_rechecked_and_swapped_between_runs(toy: str, tmp_path: Path,
                                                                 busy_at_load: None) -> None:
    path = _chain(tmp_path / "chain.onnx")
    state = tmp_path / "state"
    # Its pick measured 0.001 ms: live latency drifts from it at once, so the re-check comes
    # whatever the load on the test machine (an idle-triggered one would not switch on a busy
    # box: test_an_idle_recheck_that_ran_busy_again_does_not_switch).
    file, expected = _provisional(path, state, toy, measured_ms=0.001)
    knobs = {"after_s": 0.3, "drift_for_s": 0.0, "idle_share": 0.01, "busy_share": 1.0,
             "poll_s": 0.1, "budget_s": 2.0}
    with edgeinfer.load_model(path, providers=[toy], threads=1, state_dir=state,
                              recheck=knobs) as m:
        assert m.report.choice.backend == "onnxruntime"
        assert m.selection is not None and m.selection["measured_under_load"]
        gen = m.generation
        charged = process_budget().used_mb
        errors: list[BaseException] = []
        deadline = time.monotonic() + 60
        while m.report.choice.backend != "toy" and time.monotonic() < deadline:
            try:  # the frames of a pipeline: every result still correct across the swap
                np.testing.assert_allclose(m.run(X)["y"], expected, rtol=1e-4, atol=1e-5)
            except BaseException as exc:  # reported below
                errors.append(exc)
                break
        assert not errors, errors
        assert m.report.choice.backend == "toy", m.selection
        assert m.generation == gen + 1 and m.rechecks == 1
        np.testing.assert_allclose(m.run(X)["y"], expected, rtol=1e-4, atol=1e-5)
        sel = m.selection
        assert sel is not None and sel["rechecks"] == 1 and "switched from" in sel["recheck"]
        t = m._selector
        if t is not None:
            t.join(10)
        assert not m._retired  # the swapped-out session was closed after its last run
        # the candidates' charges were released; the adopted one is the model's own charge
        assert process_budget().used_mb == pytest.approx(charged)
    cached = json.loads(file.read_text())  # the cache has the re-checked pick
    assert cached["choice"]["backend"] == "toy" and cached["rechecks"] == 1


def test_a_recheck_the_memory_budget_has_no_room_for_is_refused_and_the_pick_kept(
        toy: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, busy_at_load: None) -> None:
    # A re-check opens its candidates beside the serving session: each is charged what the
    # model was admitted at, so memory_budget_mb holds while it measures.
    path = _chain(tmp_path / "chain.onnx")
    state = tmp_path / "state"
    file, expected = _provisional(path, state, toy, measured_ms=0.001)
    knobs = {"after_s": 0.3, "drift_for_s": 0.0, "idle_share": 0.01, "busy_share": 1.0,
             "poll_s": 0.1, "budget_s": 2.0}
    budget = process_budget()
    limit = budget.limit_mb
    caplog.set_level("WARNING", logger="edgeinfer")
    with edgeinfer.load_model(path, providers=[toy], threads=1, state_dir=state,
                              recheck=knobs) as m:
        own = budget.charged_mb(m._budget_key)
        assert own is not None and own > 0
        used = budget.used_mb
        budget.set_limit(used + own / 2)  # room for this model, not for a second copy of it
        try:
            deadline = time.monotonic() + 60
            while "re-checking backends" not in caplog.text and m.generation == 0 \
                    and time.monotonic() < deadline:
                np.testing.assert_allclose(m.run(X)["y"], expected, rtol=1e-4, atol=1e-5)
            t = m._selector
            if t is not None:
                t.join(10)
        finally:
            budget.set_limit(limit)
        assert "re-checking backends for chain stopped, onnxruntime" in caplog.text, caplog.text
        assert "memory_budget_mb" in caplog.text and "recheck.enabled: false" \
            in caplog.text
        assert m.report.choice.backend == "onnxruntime" and m.generation == 0
        np.testing.assert_allclose(m.run(X)["y"], expected, rtol=1e-4, atol=1e-5)
        assert budget.used_mb == pytest.approx(used)  # nothing of the refused re-check is left
    assert json.loads(file.read_text())["choice"]["backend"] == "onnxruntime"


def test_measuring_beside_a_serving_model_is_charged_to_the_budget(
        toy: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _chain(tmp_path / "chain.onnx")
    budget = process_budget()
    limit = budget.limit_mb
    caplog.set_level("WARNING", logger="edgeinfer")
    with edgeinfer.load_model(path, providers=[toy], threads=1, state_dir=tmp_path / "s",
                              probe=False) as m:
        expected = m.run(X)["y"]
        own = budget.charged_mb(m._budget_key)
        assert own is not None and own > 0
        used = budget.used_mb
        budget.set_limit(used + own / 2)
        try:
            assert m.select_backend() is None  # refused before a candidate was opened
        finally:
            budget.set_limit(limit)
        assert "measuring backends for chain stopped" in caplog.text, caplog.text
        assert "or set the model's probe: false" in caplog.text
        assert budget.used_mb == pytest.approx(used) and m.generation == 0
        np.testing.assert_allclose(m.run(X)["y"], expected)


def test_a_cached_pick_the_budget_has_no_room_for_beside_the_serving_one_is_kept(
        toy: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _chain(tmp_path / "chain.onnx")
    state = tmp_path / "state"
    file, expected = _provisional(path, state, toy)  # cached: onnxruntime (opt basic) picked
    picked = Decision.from_dict(json.loads(file.read_text())).choice
    budget = process_budget()
    limit = budget.limit_mb
    caplog.set_level("WARNING", logger="edgeinfer")
    with edgeinfer.load_model(path, providers=[toy], threads=1, state_dir=state,
                              probe=False) as m:
        serving = m.report.choice  # probe=False: onnxruntime's defaults, not the cached pick
        assert serving is not None and serving != picked
        own = budget.charged_mb(m._budget_key)
        assert own is not None and own > 0
        used = budget.used_mb
        budget.set_limit(used + own / 2)
        try:
            m.select_backend()  # the cached pick would open beside the serving session
        finally:
            budget.set_limit(limit)
        assert "staying on" in caplog.text and "kept for the next start" in caplog.text, \
            caplog.text
        assert m.report.choice == serving and m.generation == 0
        assert budget.used_mb == pytest.approx(used)
        np.testing.assert_allclose(m.run(X)["y"], expected, rtol=1e-4, atol=1e-5)
    assert file.exists()  # the decision is not forgotten: the next start opens it


def test_no_recheck_when_turned_off_or_in_the_first_seconds(toy: str, tmp_path: Path,
                                                           busy_at_load: None) -> None:
    path = _chain(tmp_path / "chain.onnx")
    state = tmp_path / "s"
    _provisional(path, state, toy)
    opts = {"providers": [toy], "threads": 1, "state_dir": state}
    with edgeinfer.load_model(path, recheck=False, **opts) as m:
        assert m._watch is None and m.selection is not None
    busy = {"idle_share": 1.0, "busy_share": 1.0, "idle_for_s": 0.0, "poll_s": 0.01,
            "after_s": 3600.0}
    with edgeinfer.load_model(path, recheck=busy, **opts) as m:
        assert m._watch is not None and m._watch.policy.provisional
        for _ in range(50):
            m.run(X)
            time.sleep(0.002)
        assert m.rechecks == 0 and not m.selecting


def _decision_for(*rows: Row) -> Decision:
    return Decision(rows[0].choice, list(rows), "outputs", "", load=Load(0.5, 0.0, 2),
                    under_load=True)


@pytest.mark.parametrize(("runner_up_ms", "switched"), [(1.0, True), (5.7, False)])
def test_a_recheck_switches_only_to_a_clearly_faster_runner_up(
        runner_up_ms: float, switched: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[str] = []
    slow = Choice("onnxruntime", CPU, threads=1)
    fast = Choice("onnxruntime", CPU, threads=2)
    ms = {slow: 6.0, fast: runner_up_ms}
    decision = _decision_for(Row(slow, "picked", 5.0), Row(fast, "ok", 9.0))
    spec = SessionSpec(path=Path("m.onnx"), format="onnx", sha256="0", threads=2)
    clock = FakeClock()  # 5.7 against 6.0 ms is 1.05x: sleeps under load could make it 1.1x
    monkeypatch.setattr(timing, "time", clock)
    outcome = remeasure(spec, decision, select.OutputsGate(), trigger="idle",
                        settings=RecheckSettings(budget_s=0.5),
                        opener=lambda s, c: ClockedSession(ms[c], log, c.label(), clock),
                        meter=LoadMeter(FakeTimes(0.02)))
    assert outcome is not None
    new = outcome.decision
    assert new.rechecks == 1 and new.load is not None and new.created > 0
    if switched:
        assert outcome.stable and outcome.session is not None
        assert new.choice == fast and "switched from onnxruntime CPU fp32 1t" in new.recheck_note
        outcome.session.close()
    else:  # 5 % faster: under switch_gain, the serving choice stays
        assert outcome.session is None and new.choice == slow
        assert "kept onnxruntime CPU fp32 1t" in new.recheck_note
    assert [r.status for r in new.rows].count("picked") == 1
    assert all(r.final for r in new.rows)


def test_a_recheck_measures_everything_again_when_the_busy_boot_did_not_reach_it(
        tmp_path: Path) -> None:
    # A busy first boot spent its budget on the reference alone: the re-check measures every
    # candidate again (correctness against fp32 included) and switches to the clearly faster.
    log: list[str] = []
    spec = SessionSpec(path=tmp_path / "m.onnx", format="onnx", sha256="0", threads=2,
                       providers=("cpu",), probe=True, probe_budget_s=3.0)
    ref = select.reference_choice(spec)
    cands, _ = select.candidates(spec)
    fast = next(c for c in cands if c.threads == 1)

    def opener(s: SessionSpec, c: Choice) -> SleepySession:
        return SleepySession(1.0 if c == fast else 8.0, log, c.label())

    rows = [Row(ref, "picked", 8.0, accuracy="reference")]
    rows += [Row(c, "skipped", reason="probe budget 15 s spent") for c in cands if c != ref]
    decision = _decision_for(*rows)
    outcome = select.recheck(spec, decision, select.OutputsGate(), trigger="idle",
                             opener=opener, meter=LoadMeter(FakeTimes(0.02)))
    assert outcome is not None and outcome.session is not None
    outcome.session.close()
    new = outcome.decision
    assert new.choice == fast and new.rechecks == 1
    assert "measured every candidate again: switched from" in new.recheck_note
    assert {r.choice for r in new.rows if r.status in ("ok", "picked")} >= {ref, fast}


def test_an_idle_recheck_that_ran_busy_again_does_not_switch() -> None:
    log: list[str] = []
    slow, fast = Choice("onnxruntime", CPU, threads=1), Choice("onnxruntime", CPU, threads=2)
    ms = {slow: 6.0, fast: 1.0}
    decision = _decision_for(Row(slow, "picked", 5.0), Row(fast, "ok", 9.0))
    spec = SessionSpec(path=Path("m.onnx"), format="onnx", sha256="0", threads=2)
    outcome = remeasure(spec, decision, select.OutputsGate(), trigger="idle",
                        settings=RecheckSettings(budget_s=0.5),
                        opener=lambda s, c: SleepySession(ms[c], log, c.label()),
                        meter=LoadMeter(FakeTimes(0.6)))
    assert outcome is not None and outcome.session is None
    new = outcome.decision
    assert new.choice == slow and new.under_load  # still provisional
    assert "the box busy again" in new.recheck_note
