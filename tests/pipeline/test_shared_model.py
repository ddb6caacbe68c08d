"""Pipelines naming the same model share one loaded session (``edgeinfer.model.pool``): real models
(a tiny classifier built with onnx.helper, YOLOv8n-320, Silero VAD), real video and WAV files,
real worker processes, and the daemon's reload."""

from __future__ import annotations

import json
import os
import signal
import time
import wave
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer import samples
from edgeinfer.config import Config, parse_config
from edgeinfer.pipeline import Pipeline
from edgeinfer.model.pool import SharedModel, model_pool
from edgeinfer.testing import onnx_models as om


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.demo_video(tmp_path_factory.mktemp("video") / "people.avi", frames=30)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return om.tiny_classifier(tmp_path_factory.mktemp("models") / "tiny.onnx", size=32)


_BEFORE = [0]  # models other tests of the session left in the pool


def loaded() -> int:
    """Models in the process's pool that this test loaded."""
    return len(model_pool()) - _BEFORE[0]


@pytest.fixture(autouse=True)
def _pool_left_as_found() -> Iterator[None]:
    _BEFORE[0] = len(model_pool())
    yield
    assert loaded() == 0, "the test left a model loaded"


def _classify(name: str, model: Path, source: dict[str, Any], **model_opts: Any
              ) -> dict[str, Any]:
    return {"name": name, "source": source, "model": {"path": str(model), **model_opts},
            "task": {"type": "classify", "top_k": 3, "preprocess": {"size": [32, 32]}},
            "sinks": []}


def _detect(name: str, model: Path, source: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "source": source, "model": {"path": str(model), "threads": 1},
            "task": {"type": "detect", "decoder": "yolov8", "score_threshold": 0.25,
                     "preprocess": {"size": [320, 320]}},
            "sinks": []}


def _config(*pipelines: dict[str, Any]) -> Config:
    return parse_config(json.dumps({"pipelines": list(pipelines)}))


def _build(config: Config, results: dict[str, list[Any]]) -> list[Pipeline]:
    built = []
    for pc in config.pipelines:
        out = results.setdefault(pc.name, [])
        built.append(Pipeline.from_config(config, name=pc.name, on_result=out.append))
    return built


def _wait(until: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _top(results: list[Any]) -> list[list[dict[str, Any]]]:
    return [[c.to_dict() for c in r.task.top] for r in results]


def _solo(config: Config, name: str) -> list[Any]:
    """The results of one pipeline of ``config`` run alone."""
    results: list[Any] = []
    Pipeline.from_config(config, name=name, on_result=results.append).run()
    return results


def test_four_pipelines_on_one_model_share_one_session_and_close_it_last(
        tiny: Path, video: Path) -> None:
    src = {"type": "video", "uri": str(video)}
    config = _config(*(_classify(f"cam{i}", tiny, src, threads=1) for i in range(4)),
                     _classify("other", tiny, src, threads=2))
    reference = _top(_solo(config, "cam0"))
    results: dict[str, list[Any]] = {}
    pipes = _build(config, results)
    # the same file with the same options: one session; other threads: a session of its own
    assert loaded() == 2
    shared = {id(p.model.shared) for p in pipes[:4] if isinstance(p.model, SharedModel)}
    assert len(shared) == 1 and pipes[4].model.shared is not pipes[0].model.shared
    assert [p.model.name for p in pipes] == ["tiny"] * 5
    for p in pipes:
        p.start()
    for p in pipes:
        assert p.join(120)
    for name in ("cam0", "cam1", "cam2", "cam3", "other"):
        # every camera's frames got their own outputs back, none another pipeline's
        assert _top(results[name]) == reference, name
    snap = pipes[1].snapshot()
    assert snap["shared"]["pipelines"] == ["cam0", "cam1", "cam2", "cam3"]
    assert snap["shared"]["runs"] == 30 and snap["shared"]["model_runs"] == 120
    assert snap["processed"] == 30 and "wait" in snap["latency_ms"]
    assert pipes[4].snapshot()["shared"]["pipelines"] == ["other"]
    # the stats topic carries the snapshots; `edgeinfer watch` shows the wait where it applies
    from edgeinfer.cli.watch_cmd import _stats_line

    line = _stats_line({"pipelines": {p.name: json.loads(json.dumps(p.snapshot()))
                                      for p in (pipes[1], pipes[4])}})
    assert line.startswith("cam1 ") and " wait p50 " in line.split("other")[0]
    assert " wait p50 " not in line.split("other")[1]

    model = pipes[0].model.shared
    for p in pipes[:3]:
        p.close()
    assert not model.closed and loaded() == 2
    assert pipes[3].model.run({"image": np.zeros((1, 3, 32, 32), np.float32)})["logits"].shape \
        == (1, 10)
    pipes[3].close()
    assert model.closed and loaded() == 1
    pipes[4].close()


def test_four_yolo_pipelines_share_one_session_and_detect_as_one_alone(
        yolo_path: Path, video: Path) -> None:
    config = _config(*(_detect(f"cam{i}", yolo_path, {"type": "video", "uri": str(video)})
                       for i in range(4)))
    reference = [r.task.detections for r in _solo(config, "cam0")]
    assert sum(len(d) for d in reference) >= 30  # the clip's person, in every frame
    results: dict[str, list[Any]] = {}
    pipes = _build(config, results)
    try:
        assert loaded() == 1
        assert len({id(p.model.shared) for p in pipes if isinstance(p.model, SharedModel)}) == 1
        for p in pipes:
            p.start()
        for p in pipes:
            assert p.join(300)
        for name, got in results.items():
            assert [r.task.detections for r in got] == reference, name
        for p in pipes:
            s = p.snapshot()
            assert s["processed"] == 30 and s["errors"] == 0
            # round-robin: a frame never waits for more than one run of each other pipeline
            assert s["shared"]["max_waited_runs"] <= 3, s["shared"]
    finally:
        for p in pipes:
            p.close()


def test_a_slow_camera_is_served_while_three_others_flood_the_model(
        yolo_path: Path, video: Path) -> None:
    flood = {"type": "video", "uri": str(video), "loop": True}
    slow = {"type": "video", "uri": str(video), "fps": 10}
    config = _config(*(_detect(f"flood{i}", yolo_path, flood) for i in range(3)),
                     _detect("slow", yolo_path, slow))
    results: dict[str, list[Any]] = {}
    pipes = _build(config, results)
    try:
        for p in pipes:
            p.start()
        assert pipes[3].join(300)  # the slow file ended: every one of its frames was served
        busy = [p.stats.processed for p in pipes[:3]]
        _wait(lambda: all(p.stats.processed > n for p, n in zip(pipes, busy, strict=False)))
        assert len(results["slow"]) == 30 and pipes[3].stats.errors == 0
        for p in pipes:  # with everyone waiting, nobody waited for more than one run of each
            assert p.snapshot()["shared"]["max_waited_runs"] <= 3, p.name
        served = {p.name: p.snapshot()["shared"]["runs"] for p in pipes}
        assert all(served[f"flood{i}"] > 0 for i in range(3)), served
    finally:
        for p in pipes:
            p.close()


def test_an_fps_cap_holds_back_one_sharer_only(tiny: Path, video: Path) -> None:
    src = {"type": "video", "uri": str(video), "loop": True}
    config = _config(_classify("capped", tiny, src), _classify("free", tiny, src))
    capped, free = _build(config, {})
    try:
        assert capped.model.shared is free.model.shared
        capped.tune({"max_fps": 2})
        capped.start()
        free.start()
        _wait(lambda: free.stats.processed >= 300 and capped.stats.processed >= 1)
        for p in (capped, free):  # stopped: the counters hold still while they are compared
            p.stop()
            assert p.join(30)
        # the capped camera skips frames over its cap (counted as such), the other does not
        assert capped.stats.paused > 0 and free.stats.paused == 0
        assert capped.stats.processed < free.stats.processed
        assert capped.snapshot()["dropped"]["paused"] == capped.stats.paused
    finally:
        capped.close()
        free.close()


def test_a_crashed_shared_worker_is_restarted_once_and_costs_one_frame(
        tiny: Path, video: Path) -> None:
    src = {"type": "video", "uri": str(video), "loop": True}
    config = _config(*(_classify(f"cam{i}", tiny, src, isolation="process") for i in range(2)))
    pipes = _build(config, {})
    try:
        model = pipes[0].model
        assert isinstance(model, SharedModel) and pipes[1].model.shared is model.shared
        pid = model.worker_pid
        assert pid is not None
        for p in pipes:
            p.start()
        _wait(lambda: all(p.stats.processed > 5 for p in pipes))
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: sum(p.stats.errors for p in pipes) == 1)
        after = [p.stats.processed for p in pipes]
        _wait(lambda: all(p.stats.processed > n + 5 for p, n in zip(pipes, after, strict=True)))
        assert model.worker_pid not in (None, pid)
        # one restart for all sharers: the frame in flight failed, the others were served
        assert sum(p.stats.errors for p in pipes) == 1
        assert sum(p.stats.worker_restarts for p in pipes) == 1
        assert all(p.snapshot()["shared"]["worker_restarts"] == 1 for p in pipes)
        assert all(p.snapshot()["state"] == "running" for p in pipes)
    finally:
        for p in pipes:
            p.close()


def _wav(path: Path, audio: np.ndarray) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(audio.astype("<i2").tobytes())
    return path


def test_vad_state_stays_with_each_pipeline_on_a_shared_model(
        silero_path: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    t = np.arange(16000 * 2) / 16000
    tones = (8000 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(
        np.int16)
    noise = rng.normal(0, 300, 16000 * 2).astype(np.int16)
    wavs = {"tones": _wav(tmp_path / "tones.wav", tones),
            "noise": _wav(tmp_path / "noise.wav", noise)}

    def vad(name: str) -> dict[str, Any]:
        return {"name": name, "source": {"type": "audio", "path": str(wavs[name])},
                "model": {"path": str(silero_path), "threads": 1}, "task": {"type": "vad"},
                "sinks": []}

    config = _config(vad("tones"), vad("noise"))
    alone = {name: [r.task.vad.probability for r in _solo(config, name)] for name in wavs}
    assert alone["tones"] != alone["noise"]
    results: dict[str, list[Any]] = {}
    pipes = _build(config, results)
    try:
        assert loaded() == 1
        for p in pipes:
            p.start()
        for p in pipes:
            assert p.join(120)
        for name in wavs:  # each stream's state went into its own next window only
            probs = [r.task.vad.probability for r in results[name]]
            np.testing.assert_allclose(probs, alone[name], atol=1e-6)
    finally:
        for p in pipes:
            p.close()


def test_reload_keeps_a_model_still_used_and_loads_a_changed_one(
        tiny: Path, video: Path, tmp_path: Path) -> None:
    from edgeinfer.config import load_config
    from edgeinfer.daemon import Daemon

    src = {"type": "video", "uri": str(video), "loop": True}
    path = tmp_path / "c.yaml"

    def write(*pipelines: dict[str, Any]) -> None:
        path.write_text(json.dumps({"pipelines": list(pipelines)}))

    a, b = _classify("a", tiny, src, threads=1), _classify("b", tiny, src, threads=1)
    write(a, b)
    daemon = Daemon(load_config(path), config_path=str(path))
    daemon.startup()
    try:
        def model(name: str) -> Any:
            return next(p.model.shared for p in daemon.pipelines if p.name == name)

        first = model("a")
        assert model("b") is first and loaded() == 1
        # a's sinks change: a is rebuilt around the model it ran, nothing is loaded
        write(dict(a, sinks=[{"type": "jsonl", "path": str(tmp_path / "a.jsonl")}]), b)
        assert daemon.reload()["restarted"] == ["a"]
        assert model("a") is first and model("b") is first and loaded() == 1
        # b alone: a removed, b keeps its model; then b's task changes, still the same model
        write(b)
        assert daemon.reload()["removed"] == ["a"] and model("b") is first
        write(dict(b, task=dict(b["task"], top_k=2)))
        assert daemon.reload()["restarted"] == ["b"] and model("b") is first
        assert loaded() == 1 and not first.closed
        # other load options: a new session, and the old one, no longer used, is closed
        write(_classify("b", tiny, src, threads=2))
        assert daemon.reload()["restarted"] == ["b"]
        assert model("b") is not first and first.closed and loaded() == 1
        p = next(p for p in daemon.pipelines if p.name == "b")
        _wait(lambda: p.stats.processed > 3)
    finally:
        daemon.shutdown()
