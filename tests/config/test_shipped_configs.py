"""Every config shipped in configs/ runs with the model it names, not only validates: each
pipeline is built with its own model, task, tracking, zones and lines exactly as shipped, and
only what a test machine lacks is swapped for the same kind of input (a camera for the demo clip
of the astronaut, a microphone for spoken words from espeak-ng) and the sinks for a JSON-lines
file. Results must come out, with labels the model really has."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import wave
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from edgeinfer.config import AudioSource, JsonlSink, VideoSource, load_config
from edgeinfer.config.schema import Config, PipelineConfig
from edgeinfer.model import samples
from edgeinfer.pipeline.build import build_pipeline

ROOT = Path(__file__).resolve().parents[2]
DEVICE_CONFIGS = ["audio-vad.yaml", "camera-detect.yaml", "jetson.yaml", "pi4.yaml",
                  "scene-analytics.yaml", "example.yaml", "demo.yaml"]
RESULTS = 12  # enough for a tracked pipeline's first confirmed tracks


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng; .ci/run does)")
    folder = tmp_path_factory.mktemp("speech")
    raw = folder / "espeak.wav"
    subprocess.run([espeak, "-w", str(raw), "edge inference on a small board"], check=True,
                   timeout=60)
    with wave.open(str(raw)) as w:
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32)
    # 16 kHz mono s16le: what the shipped audio config's arecord command delivers.
    n = round(len(x) * 16000 / rate)
    pcm = np.interp(np.arange(n) * (rate / 16000), np.arange(len(x)), x).astype("<i2")
    path = folder / "words.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return path


def _stand_in(pc: PipelineConfig, tmp: Path, spoken: Path | None) -> PipelineConfig:
    """``pc`` with its source and sinks swapped for files; everything else as shipped."""
    if isinstance(pc.source, AudioSource):
        assert spoken is not None
        source: Any = AudioSource(path=str(spoken), window=pc.source.window,
                                  sample_rate=pc.source.sample_rate)
    else:
        width, height = getattr(pc.source, "width", None), getattr(pc.source, "height", None)
        size = (width, height) if isinstance(width, int) and isinstance(height, int) \
            else (640, 480)
        clip = samples.demo_video(tmp / f"clip-{size[0]}x{size[1]}.mp4", frames=40, size=size)
        source = VideoSource(uri=str(clip))
    return msgspec.structs.replace(pc, source=source,
                                   sinks=[JsonlSink(path=str(tmp / f"{pc.name}.jsonl"))])


def _run(config: Config, pc: PipelineConfig, tmp: Path, limit: int
         ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    runtime = msgspec.structs.replace(config.runtime, state_dir=str(tmp / "state"))
    pipeline = build_pipeline(pc, runtime=runtime)
    out: list[dict[str, Any]] = []
    timer = threading.Timer(120, pipeline.stop)  # bounded: a stuck pipeline fails, not hangs
    timer.start()
    try:
        for result in pipeline:
            out.append(result.to_dict())
            if len(out) >= limit:
                break
    finally:
        timer.cancel()
        pipeline.close()
    return out, pipeline.snapshot()


@pytest.mark.parametrize("name", DEVICE_CONFIGS)
def test_a_shipped_config_runs_with_the_model_it_names(
        name: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative outputs (results/, models/) land here
    monkeypatch.setenv("EDGEINFER_DEMO_OUT", str(tmp_path / "demo.jsonl"))
    path = ROOT / "configs" / name
    if name == "example.yaml":  # its model is "models/320n.onnx" beside the config
        (tmp_path / "models").mkdir()
        shutil.copy(request.getfixturevalue("yolo_path"), tmp_path / "models" / "320n.onnx")
        shutil.copy(path, tmp_path / name)
        path = tmp_path / name
    config = load_config(path, stand_in_credentials=True)
    assert config.pipelines, f"{name} has no pipeline"
    for pc in config.pipelines:
        audio = isinstance(pc.source, AudioSource)
        spoken = request.getfixturevalue("spoken") if audio else None
        # Audio: the whole recording (about 100 windows), to reach the speech.
        results, stats = _run(config, _stand_in(pc, tmp_path, spoken), tmp_path,
                              1000 if audio else RESULTS)
        assert results, f"{name}: pipeline {pc.name} gave no result"
        labels = getattr(pc.task, "classes", None)
        for r in results:
            for d in r.get("detections", []):
                assert labels is None or d["label"] in labels, (name, d)
        if name == "scene-analytics.yaml":
            # The astronaut is a person: the shipped people-counting config sees her.
            people = [d for r in results for d in r["detections"] if d["label"] == "person"]
            assert people, results[-1]
            # The stats say how the model is read: MediaPipe's person detector, by auto.
            assert stats["task"]["decoder"] == "blazepose", stats["task"]
        if audio:
            assert any(r["vad"]["speech"] for r in results), json.dumps(results[-1])
