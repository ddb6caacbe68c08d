"""Pipelines built from config with real models, real files and real processes: the demo, a
BlazeFace video pipeline, and ``edgeinfer run`` as a subprocess stopped with SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgeinfer import samples
from edgeinfer.config import parse_config
from edgeinfer.errors import ConfigError
from edgeinfer.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.demo_video(tmp_path_factory.mktemp("video") / "people.avi", frames=30)


def face_config(video: Path, blazeface: Path, out: Path, **extra: object) -> str:
    pipeline = {
        "name": "faces",
        "source": {"type": "video", "uri": str(video)},
        "model": {"path": str(blazeface), "threads": 2},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        "sinks": [{"type": "jsonl", "path": str(out)}],
        **extra,
    }
    return json.dumps({"device_id": "test", "pipelines": [pipeline]})


def cli(*args: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "edgeinfer", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=kw.get("cwd", ROOT))


def test_face_pipeline_from_config_finds_the_face_in_every_frame(
        demo_video: Path, blazeface_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "faces.jsonl"
    config = parse_config(face_config(demo_video, blazeface_path, out))
    results = list(Pipeline.from_config(config))
    assert len(results) == 30
    assert all(len(r.task.detections) == 1 for r in results)
    boxes = [r.task.detections[0].box for r in results]
    assert boxes[0] != boxes[-1]  # the clip pans and zooms: the face moves
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [d["seq"] for d in lines] == list(range(1, 31))
    assert lines[0]["detections"][0]["label"] == "face"
    assert lines[0]["provider"] == "xnnpack" and lines[0]["frame"]["width"] == 640


def test_decoder_that_does_not_fit_the_model_is_refused_before_the_source_opens(
        blazeface_path: Path, tmp_path: Path) -> None:
    text = face_config(tmp_path / "missing.avi", blazeface_path, tmp_path / "o.jsonl")
    text = text.replace('"blazeface", "score_threshold"', '"yolov8", "score_threshold"')
    with pytest.raises(ConfigError, match=r"decoder yolov8 .*regressors \[1, 896, 16\]"):
        Pipeline.from_config(parse_config(text))


def test_edgeinfer_run_processes_a_file_and_exits_0(
        demo_video: Path, blazeface_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(face_config(demo_video, blazeface_path, out))
    proc = cli("run", "-c", str(cfg))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert len(out.read_text().splitlines()) == 30
    assert "faces: 30 frames, 30 results" in stderr
    assert "Traceback" not in stderr


def test_sigterm_stops_a_live_pipeline_gracefully(yolo_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "live.jsonl"
    cfg = tmp_path / "live.yaml"
    cfg.write_text(json.dumps({"pipelines": [{
        "name": "live",
        "source": {"type": "synthetic", "width": 320, "height": 240, "fps": 30},
        "model": {"path": str(yolo_path), "threads": 1},
        "task": {"type": "detect", "decoder": "yolov8", "preprocess": {"size": [320, 320]}},
        "sinks": [{"type": "jsonl", "path": str(out)}],
    }]}))
    proc = cli("run", "-c", str(cfg))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or out.stat().st_size < 1000):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    lines = out.read_text().splitlines()
    assert lines and json.loads(lines[-1])["pipeline"] == "live"  # the last line is whole
    assert "live: " in stderr and " results" in stderr


def test_a_failing_optional_pipeline_is_reported_and_the_others_run(
        demo_video: Path, blazeface_path: Path, tmp_path: Path) -> None:
    good = json.loads(face_config(demo_video, blazeface_path, tmp_path / "ok.jsonl"))
    bad = dict(good["pipelines"][0], name="broken",
               model={"path": str(tmp_path / "nope.tflite")})
    cfg = tmp_path / "two.yaml"
    cfg.write_text(json.dumps({"pipelines": [good["pipelines"][0], bad]}))
    proc = cli("run", "-c", str(cfg))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    # validate-config's words, before the model is looked for (the daemon shares its check)
    assert ("broken: not started: $.pipelines[1].model.path: pipeline 'broken': model file "
            "not found") in stderr, stderr
    assert len((tmp_path / "ok.jsonl").read_text().splitlines()) == 30
    bad["required"] = True
    cfg.write_text(json.dumps({"pipelines": [good["pipelines"][0], bad]}))
    proc = cli("run", "-c", str(cfg))
    _, stderr = proc.communicate(timeout=120)
    # a config whose required model is missing cannot start: EX_CONFIG, not restarted by systemd
    assert proc.returncode == 78 and "model file not found" in stderr


def test_the_demo_runs_end_to_end(tmp_path: Path) -> None:
    proc = cli("demo", "--out", str(tmp_path / "demo.jsonl"), cwd=tmp_path)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    lines = [json.loads(x) for x in (tmp_path / "demo.jsonl").read_text().splitlines()]
    assert len(lines) == 90 and all(len(d["detections"]) == 1 for d in lines)
    # received over MQTT from the broker (on failure: what else it printed, and the demo's words)
    odd = [x for x in stdout.splitlines() if not x.startswith("mqtt demo faces #")]
    assert stdout.count("mqtt demo faces #") == 90, (odd, stderr[-3000:])
    assert stdout.count(" face 0.") == 90


def test_configs_demo_is_the_packaged_demo() -> None:
    assert (ROOT / "configs" / "demo.yaml").read_text() == \
        (ROOT / "edgeinfer" / "demo.yaml").read_text()


def test_every_shipped_config_validates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The device configs read the MQTT password as a systemd credential.
    (tmp_path / "mqtt_password").write_text("secret\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        if path.name.startswith("collect"):  # the fleet collector's config, not a device's
            from edgeinfer.config.collect import CollectConfig
            from edgeinfer.config.loader import load_struct

            assert load_struct(path, CollectConfig).database.dsn
            continue
        proc = cli("validate-config", str(path))
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{path.name}: {stderr}"


def test_preprocess_size_fixes_dynamic_inputs_of_a_model_named_by_catalog_name(
        yolo_path: Path) -> None:
    from edgeinfer.pipeline.build import load_pipeline_model
    from edgeinfer.config import RuntimeConfig

    config = parse_config(json.dumps({"pipelines": [{
        "name": "y", "source": {"type": "synthetic"}, "model": {"path": "nudenet-320n"},
        "task": {"type": "detect", "decoder": "yolov8", "preprocess": {"size": [320, 256]}},
    }]}))
    with load_pipeline_model(config.pipelines[0], RuntimeConfig()) as model:
        assert model.inputs[0].shape == (1, 3, 256, 320)
        assert model.report.warmed_up


def test_tune_snapshot_pause_and_resume_a_running_pipeline(
        demo_video: Path, blazeface_path: Path, tmp_path: Path) -> None:
    import cv2
    import numpy as np

    text = json.loads(face_config(demo_video, blazeface_path, tmp_path / "t.jsonl"))
    text["pipelines"][0]["source"] = {"type": "video", "uri": str(demo_video), "fps": 30,
                                      "loop": True}
    p = Pipeline.from_config(parse_config(json.dumps(text)))
    p.start()
    try:
        deadline = time.monotonic() + 30
        while p.stats.processed < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        jpeg = p.snapshot_jpeg()
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (480, 640, 3)
        green = (image[:, :, 1] > 200) & (image[:, :, 0] < 80) & (image[:, :, 2] < 80)
        assert green.sum() > 100  # the box is drawn

        with pytest.raises(ConfigError, match="tunable: .*score_threshold"):
            p.tune({"score_thresh": 0.5})
        with pytest.raises(ConfigError, match="score_threshold"):
            p.tune({"score_threshold": 1.5})
        settings = p.tune({"score_threshold": 0.999, "max_fps": 10})
        assert settings["score_threshold"] == 0.999 and settings["max_fps"] == 10
        time.sleep(0.5)
        n = p.stats.emitted
        while p.stats.emitted < n + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p._last is not None and p._last[1].detections == ()

        p.pause()
        time.sleep(0.3)
        before = p.stats.processed
        time.sleep(0.5)
        assert p.stats.processed - before <= 2 and p.snapshot()["state"] == "paused"
        p.resume()
        while p.stats.processed <= before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.stats.processed > before + 2
    finally:
        p.close()


@pytest.mark.parametrize("kind", ["detect", "classify"])
def test_labels_on_snapshots_sit_on_a_dark_plate(kind: str) -> None:
    """Box and class labels stay readable on a bright scene: bare green text on white (or
    on a green field) was low-contrast."""
    import cv2
    import numpy as np

    from edgeinfer.frames import Classification, Detection, Frame, TaskResult
    from edgeinfer.pipeline.tuning import annotate

    frame = Frame(0, 0.0, 0.0, np.full((480, 640, 3), 255, np.uint8))
    if kind == "detect":
        part = TaskResult(detections=(Detection("face", 0, 0.91, (100.0, 100.0, 300.0, 300.0)),))
        rows, cols = slice(78, 100), slice(100, 190)  # just above the box
    else:
        part = TaskResult(top=(Classification("tabby cat", 281, 0.87),))
        rows, cols = slice(4, 26), slice(4, 120)
    image = cv2.imdecode(np.frombuffer(annotate(frame, part), np.uint8), cv2.IMREAD_COLOR)
    label = image[rows, cols].astype(np.int16)
    dark = (label.max(axis=2) < 60).sum()
    text = ((label[..., 1] > 150) & (label[..., 0] < 120) & (label[..., 2] < 120)).sum()
    assert dark > 300 and text > 20, (dark, text)
