"""Event clips cut from a real RTSP camera's own H.264 packets (GStreamer's RTSP server on
loopback, read by the PyAV camera): the pre-roll is there, the clip starts on a keyframe, every
frame decodes, no encoder CPU is spent, and Debian's Chromium plays it in a ``<video>``; a
pipeline built from config hands its recorder the camera's packets."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.analytics.recorder import Recorder
from edgeinfer.config.analytics import ClipConfig, RecordConfig, RetentionConfig
from edgeinfer.config import parse_config
from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.pipeline import Pipeline
from edgeinfer.sources import open_source
from edgeinfer.testing.detector_models import conv_detector_model
from edgeinfer.testing.streams import APT_PACKAGES, RtspServer, rtsp_available

av = pytest.importorskip("av", reason="PyAV is not installed (pip install 'edgeinfer[rtsp]')")

FPS = 15
PRE_S, POST_S = 1.5, 1.0
ROOMY = RetentionConfig(min_free_mb=0.01)


@pytest.fixture(scope="module")
def camera() -> Iterator[RtspServer]:
    why = rtsp_available(codec="h264")
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")
    with RtspServer(width=320, height=240, fps=FPS, codec="h264", gop=FPS) as server:
        yield server


def _record(url: str, folder: Path, event_after_s: float, run_s: float,
            **clips: Any) -> tuple[Recorder, dict[str, Any], float]:
    """Read the camera through a recorder for ``run_s`` seconds of frames, with an ``enter``
    event ``event_after_s`` in; returns the closed recorder, the event's media and its clock."""
    source = open_source(CameraConfig(uri=url, open_timeout_s=5,
                                      reconnect=ReconnectConfig(initial_s=0.05, max_s=0.2)))
    assert source.packets is not None
    rec = Recorder("cam", RecordConfig(clips=ClipConfig(pre_s=PRE_S, post_s=POST_S, **clips),
                                       retention=ROOMY), folder)
    rec.use_packets(source.packets)
    media: dict[str, Any] = {}
    at = 0.0
    watchdog = threading.Timer(30, source.stop)
    watchdog.start()
    try:
        with rec, source:
            first = None
            for frame in source:
                first = frame.ts if first is None else first
                if not media and frame.ts - first >= event_after_s:
                    at = frame.ts
                    media = rec.on_event("e1", "enter", 1, at)
                rec.offer(frame, frame.ts, [])
                if frame.ts - first >= run_s:
                    break
    finally:
        watchdog.cancel()
    return rec, media, at


@pytest.fixture(scope="module")
def remuxed(camera: RtspServer, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Recorder, dict[str, Any]]:
    rec, media, _ = _record(camera.url, tmp_path_factory.mktemp("remux"), PRE_S + 1.2,
                            PRE_S + 1.2 + POST_S + 0.5)
    return rec, media


def test_a_clip_is_cut_from_the_cameras_packets_with_its_pre_roll(
        remuxed: tuple[Recorder, dict[str, Any]]) -> None:
    rec, media = remuxed
    stats = rec.stats()
    assert stats["clips_written"] == 1 and stats["clips_remuxed"] == 1, stats
    assert media["clip_remux"] is True and media["clip_format"] == "h264/mp4"
    assert media["clip_missing"] is None and str(media["clip"]).endswith("e1.mp4")
    assert stats["encode_cpu_s"] == 0 and stats["packets"]["codec"] == "h264"
    with av.open(str(media["clip"])) as clip:
        assert "mp4" in clip.format.name
        video = clip.streams.video[0]
        frames = list(clip.decode(video))  # every frame decodes
        assert (video.codec_context.width, video.codec_context.height) == (320, 240)
    assert frames[0].key_frame and frames[0].pts == 0  # a keyframe, rebased to 0
    duration = float((frames[-1].pts - frames[0].pts) * frames[0].time_base)
    # From the keyframe at or before the pre-roll's start (keyframes 1 s apart) to the
    # post-roll's end.
    assert PRE_S + POST_S - 0.2 <= duration <= PRE_S + POST_S + 1.2, duration
    assert len(frames) >= (PRE_S + POST_S - 0.2) * FPS
    with open(str(media["clip"]), "rb") as f:  # +faststart: the index before the data
        head = f.read(4096)
    assert head.find(b"moov") != -1 and head.find(b"moov") < max(head.find(b"mdat"), 4096)


def test_a_clip_whose_packets_are_gone_says_why(camera: RtspServer, tmp_path: Path) -> None:
    # An event right at the start: the ring holds nothing from before the pre-roll's start.
    rec, media, _ = _record(camera.url, tmp_path, 0.0, POST_S + 0.6)
    assert rec.stats()["clips_missed"] == 1 and rec.stats()["clips_written"] == 0
    assert media["clip"] is None and media["clip_remux"] is True
    assert "packets from a keyframe before the clip's start were gone" in str(
        media["clip_missing"])


def test_remux_off_encodes_the_kept_frames(camera: RtspServer, tmp_path: Path) -> None:
    rec, media, _ = _record(camera.url, tmp_path, PRE_S + 0.5, PRE_S + 0.5 + POST_S + 0.4,
                            remux=False, format="mp4v")
    stats = rec.stats()
    assert media["clip_remux"] is False and media["clip_format"] == "mp4v/mp4"
    assert stats["clips_remuxed"] == 0 and stats["clips_written"] == 1
    assert stats["encode_cpu_s"] > 0 and "packets" not in stats


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_chromium_plays_the_remuxed_clip(remuxed: tuple[Recorder, dict[str, Any]]) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set and chromium is not installed")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    assert remuxed[1]["clip"], remuxed[1]  # no clip: nothing to play (and no page in the cwd)
    clip = Path(str(remuxed[1]["clip"]))
    (clip.parent / "play.html").write_text(
        f'<video id="v" src="{clip.name}" muted playsinline></video>')
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto((clip.parent / "play.html").as_uri())
            state = page.evaluate("""async () => {
                const v = document.getElementById('v');
                const t0 = performance.now();
                try { await v.play(); } catch (e) { return {error: String(e)}; }
                while (v.currentTime < 0.5 && performance.now() - t0 < 15000)
                    await new Promise(r => setTimeout(r, 50));
                return {time: v.currentTime, duration: v.duration, width: v.videoWidth,
                        error: v.error && v.error.message};
            }""")
        finally:
            browser.close()
    assert state.get("error") is None, state
    assert state["time"] >= 0.5 and state["width"] == 320, state  # it plays: time advances
    assert state["duration"] >= PRE_S + POST_S - 0.2, state


def test_a_built_pipeline_gives_its_recorder_the_cameras_packets(camera: RtspServer,
                                                                 tmp_path: Path) -> None:
    model = conv_detector_model(tmp_path / "det.onnx", size=64)
    config = parse_config(
        f"runtime: {{state_dir: '{tmp_path}'}}\n"
        "pipelines:\n  - name: cam\n"
        f"    source: {{type: camera, uri: '{camera.url}'}}\n"
        f"    model: {{path: '{model}'}}\n"
        "    task: {type: detect, decoder: yolov8, labels: [red, green]}\n"
        "    track: {}\n"
        "    lines: [{name: gate, points: [[0.5, 0], [0.5, 1]]}]\n"
        "    record: {clips: {pre_s: 2, post_s: 1}}\n", base_dir=tmp_path)
    pipeline = Pipeline.from_config(config)
    try:
        assert pipeline.source.packets is not None
        assert pipeline.analytics is not None and pipeline.analytics.recorder is not None
        stats = pipeline.analytics.recorder.stats()
        assert stats["packets"] == pipeline.source.packets.stats()  # the same ring
    finally:
        pipeline.close()


def test_an_h265_camera_gives_an_hevc_clip(tmp_path: Path) -> None:
    why = rtsp_available(codec="h265")
    if why is not None:
        pytest.skip(f"no H.265 RTSP server here: {why}")
    with RtspServer(width=320, height=240, fps=FPS, codec="h265", gop=FPS) as server:
        rec, media, _ = _record(server.url, tmp_path, PRE_S + 1.2, PRE_S + 1.2 + POST_S + 0.4)
    assert rec.stats()["clips_remuxed"] == 1 and media["clip_format"] == "hevc/mp4"
    with av.open(str(media["clip"])) as clip:
        video = clip.streams.video[0]
        frames = list(clip.decode(video))
    assert video.codec_context.name == "hevc" and frames[0].key_frame
    assert len(frames) >= (PRE_S + POST_S - 0.2) * FPS  # every frame decodes
