"""The ``camera`` source through PyAV: H.264 from GStreamer's real RTSP server on loopback
(``x264enc`` test pattern, a substream mount, an MP4 file served looping), reconnects, reasons
in words, the packet ring, ``detect_uri`` frames in main-stream geometry, and which reader
``auto`` picks."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config import load_config
from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import ConfigError, SourceError
from edgeinfer.frames import Frame
from edgeinfer.sources import Source, open_source
from edgeinfer.sources.camera import CameraSource
from edgeinfer.sources import cameras
from edgeinfer.sources.cameras import camera_reader
from edgeinfer.sources.isolated import ProcessSource
from edgeinfer.sources.packets import PacketRing, StreamInfo
from edgeinfer.testing.mosquitto import free_port
from edgeinfer.testing.streams import APT_PACKAGES, RtspServer, rtsp_available, write_h264

av = pytest.importorskip("av", reason="PyAV is not installed (pip install 'edgeinfer[rtsp]')")

from edgeinfer.sources.rtsp import PyAvSource  # noqa: E402  (needs av)

FAST = ReconnectConfig(initial_s=0.05, max_s=0.2)


def _reads_with(source: Source, reader: str) -> bool:
    """Whether ``source`` is a camera read by ``reader`` in a capture process of its own (what
    ``isolation: auto`` builds)."""
    return isinstance(source, ProcessSource) and source.reader == reader


def _need(codec: str) -> None:
    why = rtsp_available(codec=codec)
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")


def take(source: Source, frames: Iterator[Frame], n: int, timeout_s: float = 15.0) -> list[Frame]:
    """The next ``n`` frames; a watchdog stops the source so a stuck stream fails, not hangs."""
    got: list[Frame] = []
    watchdog = threading.Timer(timeout_s, source.stop)
    watchdog.start()
    try:
        for frame in frames:
            got.append(frame)
            if len(got) == n:
                return got
    finally:
        watchdog.cancel()
    raise AssertionError(f"only {len(got)} of {n} frames (stopped after {timeout_s} s or ended)")


@pytest.fixture(scope="module")
def h264() -> Iterator[RtspServer]:
    _need("h264")
    with RtspServer(width=320, height=240, fps=15, codec="h264", gop=15,
                    substream=(160, 120)) as server:
        yield server


def test_h264_frames_clock_and_packet_ring(h264: RtspServer) -> None:
    source = open_source(CameraConfig(uri=h264.url, open_timeout_s=5, reconnect=FAST))
    assert _reads_with(source, "pyav") and source.packets is not None
    source.packets.keep(1.0, 4 << 20)  # what the recorder asks for
    with source:
        frames = take(source, iter(source), 30)
    assert all(f.data.shape == (240, 320, 3) and f.display is None for f in frames)
    assert [f.index for f in frames] == sorted({f.index for f in frames})
    ts = [f.ts for f in frames]
    assert ts == sorted(ts) and ts[-1] <= time.monotonic()
    # Once the burst a connection starts with is over, the clock runs at the stream's rate
    # (pts), whatever the arrival jitter.
    assert np.allclose(np.diff(ts[-10:]), 1 / 15, atol=0.01), np.diff(ts)
    info = source.packets.info
    assert info is not None and (info.codec, info.width, info.height) == ("h264", 320, 240)
    stats = source.packets.stats()
    assert stats["packets"] and stats["seconds"] >= 0.9 and stats["bytes"] <= 4 << 20
    assert source.packets.remuxable


def test_max_fps_skips_and_counts(h264: RtspServer) -> None:
    source = open_source(CameraConfig(uri=h264.url, max_fps=5, open_timeout_s=5))
    with source:
        frames = take(source, iter(source), 6)
    assert source.stats.skipped >= 8  # 15 fps in, 5 out: two of three skipped
    assert all(b.ts - a.ts >= 0.2 - 0.01 for a, b in zip(frames[1:], frames[2:], strict=False))


def test_reconnects_after_server_restart() -> None:
    _need("h264")
    with RtspServer(width=160, height=120, fps=15, codec="h264") as server:
        source = open_source(CameraConfig(uri=server.url, open_timeout_s=2, reconnect=FAST))
        with source:
            frames = iter(source)
            before = take(source, frames, 5)
            assert source.health() is None
            server.restart(down_s=0.3)
            deadline = time.monotonic() + 30
            while not source.stats.reconnects and time.monotonic() < deadline:
                take(source, frames, 1, 30)
            after = take(source, frames, 5)
    assert source.stats.reconnects >= 1 and source.stats.errors >= 1
    # the loss, or a retry while the server was still down (a capture process reads on)
    assert any(w in source.stats.last_error for w in ("read failed: the stream stopped",
                                                      "connection refused"))
    assert after[-1].index > before[-1].index and source.health() is None


def test_refused_is_no_source_in_words_and_the_password_stays_out(
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    config = CameraConfig(uri=f"rtsp://admin:s3cret@127.0.0.1:{port}/x", backend="pyav",
                          open_timeout_s=2, reconnect=ReconnectConfig(initial_s=0.02,
                                                                       max_attempts=3))
    caplog.set_level(logging.DEBUG)
    with open_source(config) as source:
        health = source.health()
        assert source.waiting  # refused at once: waiting for the camera, not stuck
        with pytest.raises(SourceError) as info:
            list(source)
    assert health is not None and health.state == "no_source"
    assert health.reason == (f"connection refused by 127.0.0.1:{port}: is the camera (or RTSP "
                             "server) on, and the port right?")
    assert source.name == f"rtsp://admin:***@127.0.0.1:{port}/x"
    assert "s3cret" not in str(info.value) and "s3cret" not in caplog.text
    assert "s3cret" not in source.stats.last_error and source.stats.retries == 2


def test_a_server_that_answers_nothing_times_out_as_a_stall() -> None:
    with socket.socket() as quiet:  # accepts the connection, then says nothing
        quiet.bind(("127.0.0.1", 0))
        quiet.listen()
        port = quiet.getsockname()[1]
        config = CameraConfig(uri=f"rtsp://127.0.0.1:{port}/x", backend="pyav",
                              open_timeout_s=0.5, reconnect=ReconnectConfig(max_attempts=1))
        t0 = time.monotonic()
        with open_source(config) as source:
            health = source.health()
            assert not source.waiting  # a stall the watchdog should see, not an absent camera
        assert time.monotonic() - t0 < 10
    assert health is not None and health.reason == (
        f"timed out connecting to 127.0.0.1:{port}: is the camera on this network, and the "
        "address right?")


def test_pyav_asked_for_but_missing_is_refused_with_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cameras, "pyav_available", lambda: False)  # as on a board without it
    with pytest.raises(SourceError, match=r"detect_uri needs PyAV.*pip install 'edgeinfer\[rtsp\]'"):
        open_source(CameraConfig(uri="rtsp://c/main", detect_uri="rtsp://c/sub"))
    with pytest.raises(SourceError, match="backend: pyav needs PyAV"):
        open_source(CameraConfig(uri="rtsp://c/main", backend="pyav"))
    assert _reads_with(open_source(CameraConfig(uri="rtsp://c/main")), "opencv")


def test_a_missing_path_is_named(h264: RtspServer) -> None:
    config = CameraConfig(uri=f"rtsp://127.0.0.1:{h264.port}/nosuchpath", backend="pyav",
                          open_timeout_s=5, reconnect=ReconnectConfig(max_attempts=1))
    with open_source(config) as source:
        health = source.health()
    assert health is not None and health.reason == (
        f"404 stream not found on 127.0.0.1:{h264.port}: check the stream path in the URI")


def test_detect_uri_decodes_the_substream_in_main_stream_geometry(h264: RtspServer) -> None:
    source = open_source(CameraConfig(uri=h264.url, detect_uri=h264.sub_url, open_timeout_s=5,
                                      reconnect=FAST))
    assert _reads_with(source, "pyav") and source.packets is not None
    source.packets.keep(1.0, 4 << 20)
    with source:
        frames = take(source, iter(source), 20)
        deadline = time.monotonic() + 10
        while source.packets.stats()["seconds"] < 0.9 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = source.stats.to_dict()
    for f in frames:  # decoded: the substream; its geometry: the main stream's
        assert f.data.shape == (120, 160, 3)
        assert f.display == (320, 240) and (f.width, f.height) == (320, 240)
    info = source.packets.info
    assert info is not None and (info.width, info.height) == (320, 240)  # main's packets
    main = stats["main_stream"]
    assert main["open"] and main["packets"]["packets"] > 0 and main["reason"] == ""


def test_a_lost_main_stream_is_not_running_while_the_substream_is(h264: RtspServer) -> None:
    with socket.socket() as s:  # a port nobody listens on: the main stream is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    main = f"rtsp://admin:s3cret@127.0.0.1:{port}/main"
    source = open_source(CameraConfig(uri=main, detect_uri=h264.sub_url, open_timeout_s=2,
                                      reconnect=FAST))
    assert _reads_with(source, "pyav")
    with source:
        frames = iter(source)
        reader = threading.Thread(target=lambda: next(frames, None), daemon=True)
        reader.start()  # the substream is read (its frames wait for the main stream's size)
        deadline = time.monotonic() + 10
        health = source.health()
        while (health is None or "main stream" not in health.reason) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
            health = source.health()
        source.stop()
        reader.join(10)
    assert health is not None and health.state in ("no_source", "reconnecting"), health
    assert health.reason.startswith(f"main stream rtsp://admin:***@127.0.0.1:{port}/main: ")
    assert "s3cret" not in health.reason and "substream (detect_uri) is read" in health.reason


def test_a_file_is_served_looping_without_encoding(tmp_path: Path) -> None:
    _need("file")
    images = []
    for i in range(15):  # 1 s at 15 fps: a bar moving right
        img = np.full((96, 128, 3), 40, np.uint8)
        img[:, 8 * i:8 * i + 8] = (0, 0, 255)
        images.append(img)
    path = write_h264(tmp_path / "scene.mp4", images, fps=15, gop=5)
    with RtspServer(file=path) as server:
        source = open_source(CameraConfig(uri=server.url, open_timeout_s=5, reconnect=FAST))
        with source:
            frames = take(source, iter(source), 40)  # more than the file holds: it loops
    assert all(f.data.shape == (96, 128, 3) for f in frames)
    ts = [f.ts for f in frames]
    assert ts == sorted(ts) and 2.0 <= ts[-1] - ts[0] <= 3.5  # real time, across the loop
    # The bar's column goes round: it comes back to the left after the right edge.
    cols = [int(np.argmax(f.data[48, :, 2].astype(int) - f.data[48, :, 0])) for f in frames]
    assert any(b < a - 64 for a, b in zip(cols, cols[1:], strict=False)), cols


def test_a_camera_with_b_frames_gives_clips_that_decode(tmp_path: Path) -> None:
    _need("file")
    images = [np.full((96, 128, 3), 10 * i, np.uint8) for i in range(15)]
    path = write_h264(tmp_path / "b.mp4", images, fps=15, gop=15, bframes=2)
    with av.open(str(path)) as f:  # presentation order differs from decode order
        assert any(p.pts != p.dts for p in f.demux() if p.pts is not None)
    with RtspServer(file=path) as server:
        source = open_source(CameraConfig(uri=server.url, open_timeout_s=5, reconnect=FAST))
        assert source.packets is not None
        source.packets.keep(2.0, 4 << 20)
        with source:
            frames = take(source, iter(source), 40)
            cut = source.packets.cut(frames[-1].ts - 1.5, frames[-1].ts, tmp_path / "clip.mp4")
    assert cut is not None and source.stats.corrupt == 0
    with av.open(str(tmp_path / "clip.mp4")) as clip:
        decoded = list(clip.decode(clip.streams.video[0]))
    assert len(decoded) == cut.packets and decoded[0].key_frame


def test_packet_ring_keeps_whole_gops_within_its_budget() -> None:
    ring = PacketRing()
    ring.push(b"x", 0, 0, 0.0, True)
    assert ring.stats()["packets"] == 0  # nobody asked: nothing held
    ring.reset(StreamInfo("h264", 64, 48, (1, 90000)))
    ring.keep(1.0, 10_000)
    ring.push(b"p", 0, 0, 0.0, False)  # before the first keyframe: of no use for a cut
    assert ring.stats()["packets"] == 0
    for i in range(60):  # 10 fps, a keyframe every 5 packets, 100 bytes each
        ring.push(bytes(100), i * 9000, i * 9000, i / 10, i % 5 == 0)
    stats = ring.stats()
    # Held: from the keyframe at or before (5.9 - 1.0) s: the one at 4.5 s.
    assert stats["packets"] == 15 and stats["seconds"] == pytest.approx(1.4)
    ring.push(b"a", 59 * 9000, 59 * 9000, 5.9, False)  # another slice of the same picture
    assert ring.stats()["packets"] == 15 and ring.stats()["bytes"] == 1501
    ring.pin(3.0)  # a clip from 3.0 s waits for its post-roll: its packets stay
    for i in range(60, 70):
        ring.push(bytes(100), i * 9000, i * 9000, i / 10, i % 5 == 0)
    assert ring.stats()["packets"] > 15
    ring.unpin(3.0)
    for i in range(70, 200):  # past the budget: whole GOPs go, a pin or not
        ring.push(bytes(1000), i * 9000, i * 9000, i / 10, i % 5 == 0)
    assert ring.stats()["bytes"] <= 10_000


def test_auto_picks_pyav_for_rtsp_and_opencv_for_the_rest() -> None:
    assert camera_reader(CameraConfig(uri="rtsp://cam/x")) == "pyav"
    assert camera_reader(CameraConfig(uri="rtsps://cam/x")) == "pyav"
    assert camera_reader(CameraConfig(uri="rtsp://cam/x", backend="ffmpeg")) == "opencv"
    assert camera_reader(CameraConfig(uri="http://cam/mjpg")) == "opencv"
    assert camera_reader(CameraConfig(uri="/dev/video0")) == "opencv"
    assert isinstance(open_source(CameraConfig(uri="/dev/video0", isolation="thread")),
                      CameraSource)
    assert _reads_with(open_source(CameraConfig(uri="/dev/video0")), "opencv")
    assert isinstance(open_source(CameraConfig(uri="rtsp://cam/x", isolation="thread")),
                      PyAvSource)


@pytest.mark.parametrize(("source", "says"), [
    ("{type: camera, uri: 'rtsp://c/main', detect_uri: 'rtsp://c/sub', backend: ffmpeg}",
     "detect_uri needs backend pyav"),
    ("{type: camera, uri: /dev/video0, detect_uri: 'rtsp://c/sub'}",
     "both uri and detect_uri must be stream URLs"),
    ("{type: camera, uri: 'rtsp://c/main', transport: tcp, backend: ffmpeg}",
     "transport: tcp needs backend pyav"),
    ("{type: camera, uri: /dev/video0, backend: pyav}", "backend pyav reads streams"),
])
def test_config_that_cannot_work_is_refused_naming_the_path(tmp_path: Path, source: str,
                                                             says: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("pipelines:\n  - name: cam\n    model: {path: m.onnx}\n    task: {type: detect}\n"
                    f"    source: {source}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert says in str(info.value) and "$.pipelines[0].source" in str(info.value)
