"""The ``camera`` and ``picamera2`` sources: real MJPEG and RTSP servers on loopback with restarts,
a missing V4L2 device, and picamera2 through a stand-in module (a CSI camera cannot exist here)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import Picamera2Source as Picamera2Config
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import SourceError
from edgeinfer.frames import Frame
from edgeinfer.health import Health
from edgeinfer.sources import Source, open_source
from edgeinfer.sources.base import Outage
from edgeinfer.sources.isolated import ProcessSource
from edgeinfer.sources.camera import CameraSource, gstreamer_available, redact
from edgeinfer.sources.picamera import Picamera2Source
from edgeinfer.sources.reasons import device_reason, stream_reason
from edgeinfer.testing.mosquitto import free_port
from edgeinfer.testing.streams import APT_PACKAGES, MjpegServer, RtspServer, rtsp_available

FAST = ReconnectConfig(initial_s=0.05, max_s=0.2)


def take(source: Source, frames: Iterator[Frame], n: int, timeout_s: float = 10.0) -> list[Frame]:
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


def until_reconnected(source: Source, frames: Iterator[Frame], timeout_s: float = 20.0) -> None:
    """Consume frames until the source has counted a reconnect (or fail after ``timeout_s``)."""
    watchdog = threading.Timer(timeout_s, source.stop)
    watchdog.start()
    try:
        for _ in frames:
            if source.stats.reconnects:
                return
    finally:
        watchdog.cancel()
    raise AssertionError(f"no reconnect within {timeout_s} s: {source.stats}")


@pytest.fixture
def mjpeg() -> Iterator[MjpegServer]:
    with MjpegServer(width=160, height=120, fps=30) as server:
        yield server


# --- HTTP MJPEG --------------------------------------------------------------------------------


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_mjpeg_frames_and_reconnect_after_server_restart(mjpeg: MjpegServer,
                                                         isolation: str) -> None:
    source = open_source(CameraConfig(uri=mjpeg.url, open_timeout_s=2, reconnect=FAST,
                                      isolation=isolation))
    assert isinstance(source, CameraSource if isolation == "thread" else ProcessSource)
    assert source.live and source.name == mjpeg.url
    with source:
        frames = iter(source)
        before = take(source, frames, 5)
        assert all(f.data.shape == (120, 160, 3) and f.data.dtype == np.uint8 for f in before)
        assert [f.index for f in before] == list(range(5))
        assert before[0].kind == "image" and before[0].ts <= before[-1].ts

        mjpeg.stop()  # cuts the client off mid-stream; back on the same port shortly
        threading.Timer(0.3, mjpeg.start).start()
        until_reconnected(source, frames)
        after = take(source, frames, 5)
    assert source.stats.reconnects >= 1 and source.stats.errors >= 1
    assert any(w in source.stats.last_error for w in ("read failed", "connection refused"))
    assert after[0].index > before[-1].index  # the index keeps counting across reconnects
    assert all(f.data.shape == (120, 160, 3) for f in after)


def test_a_stalled_stream_times_out_and_reconnects(mjpeg: MjpegServer) -> None:
    with CameraSource(CameraConfig(uri=mjpeg.url, open_timeout_s=0.5, reconnect=FAST)) as source:
        frames = iter(source)
        take(source, frames, 3)
        mjpeg.stall()  # connected, but nothing comes: the read timeout must end the read
        threading.Timer(1.0, mjpeg.resume).start()
        until_reconnected(source, frames)
        take(source, frames, 3)
    assert source.stats.errors >= 1 and source.stats.reconnects >= 1


def test_stop_interrupts_the_backoff_wait(mjpeg: MjpegServer) -> None:
    mjpeg.stop()
    source = CameraSource(CameraConfig(uri=mjpeg.url, open_timeout_s=1,
                                       reconnect=ReconnectConfig(initial_s=30, max_s=30)))
    done = threading.Event()
    with source:
        assert source.stats.errors == 1  # the stream is missing: _open counted it, did not raise

        def run() -> None:
            for _ in source:
                pass
            done.set()

        threading.Thread(target=run, daemon=True).start()
        time.sleep(0.2)  # now waiting 30 s before the next attempt
        source.stop()
        assert done.wait(20)  # not the 30 s backoff: stop() interrupted it


def test_max_fps_skips_and_counts(mjpeg: MjpegServer) -> None:
    with CameraSource(CameraConfig(uri=mjpeg.url, max_fps=10, open_timeout_s=2)) as source:
        t0 = time.monotonic()
        frames = take(source, iter(source), 6)
        elapsed = time.monotonic() - t0
    assert elapsed >= 0.35  # 6 frames at 10 fps (RateLimiter lets the first two through together)
    assert source.stats.skipped >= 3  # the server sends 30 fps
    assert source.stats.frames == 6
    assert frames[-1].index >= 6 + source.stats.skipped - 1


# --- RTSP (GStreamer's RTSP server in a subprocess) ------------------------------------------


@pytest.fixture
def rtsp() -> Iterator[RtspServer]:
    why = rtsp_available()
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")
    with RtspServer(width=160, height=120, fps=25) as server:
        yield server


def test_rtsp_reconnects_after_server_restart(rtsp: RtspServer) -> None:
    config = CameraConfig(uri=rtsp.url, open_timeout_s=2, reconnect=FAST)
    with CameraSource(config) as source:
        frames = iter(source)
        before = take(source, frames, 5)
        assert before[0].data.shape == (120, 160, 3)
        rtsp.restart(down_s=0.3)  # same port; the client's read fails or times out, then reopens
        until_reconnected(source, frames)
        after = take(source, frames, 5)
    assert source.stats.reconnects >= 1 and source.stats.errors >= 1
    assert after[-1].index > before[-1].index
    assert all(f.data.shape == (120, 160, 3) for f in after)


# --- devices and config ------------------------------------------------------------------------


def test_missing_device_retries_then_gives_up_naming_it() -> None:
    config = CameraConfig(uri="/dev/video99",
                          reconnect=ReconnectConfig(initial_s=0.02, max_s=0.05, max_attempts=3))
    with CameraSource(config) as source:  # the daemon starts without its camera
        assert source.stats.errors == 1
        health = source.health()
        assert health is not None and health.state == "no_source" and health.retries == 0
        assert health.reason == ("no such device /dev/video99: is the camera plugged in? "
                                 "`ls /dev/video*`")
        t0 = time.monotonic()
        with pytest.raises(SourceError, match="/dev/video99"):
            for _ in source:
                pass
        assert time.monotonic() - t0 >= 0.04  # it waited between attempts
    assert source.stats.errors == 3 and source.stats.retries == 2  # every retry counted
    assert source.stats.reconnects == 0 and source.stats.frames == 0
    assert "no such device /dev/video99" in source.stats.last_error


def test_a_lasting_outage_is_warned_again_now_and_then_not_per_retry(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(Outage, "REMIND_S", 0.4)
    config = CameraConfig(uri="/dev/video99", reconnect=ReconnectConfig(initial_s=0.02, max_s=0.05))
    caplog.set_level(logging.DEBUG)
    with CameraSource(config) as source:
        reader = threading.Thread(target=lambda: list(source), daemon=True)
        reader.start()
        deadline = time.monotonic() + 20
        while not [r for r in caplog.records if "still" in r.getMessage()] \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        source.stop()
        reader.join(10)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned[0].startswith("camera /dev/video99: no such device /dev/video99"), warned
    assert warned[1].startswith("camera /dev/video99: still no such device /dev/video99"), warned
    assert " retries in " in warned[1]
    assert len(warned) < source.stats.errors / 2, (len(warned), source.stats.errors)


def _until_health(source: CameraSource, state: str, says: str = "",
                  timeout_s: float = 20.0) -> Health:
    """Until ``source.health()`` (iterated in another thread) is ``state`` with a reason that
    says ``says`` (or fail after the timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        health = source.health()
        if health is not None and health.state == state and says in health.reason:
            return health
        time.sleep(0.02)
    raise AssertionError(f"not {state} within {timeout_s} s: {source.health()}")


def test_a_refused_stream_is_no_source_in_words_and_ffmpegs_lines_go_to_debug(
        capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there: refused at once, as a camera that is off
    config = CameraConfig(uri=f"rtsp://admin:s3cret@127.0.0.1:{port}/x", open_timeout_s=2,
                          reconnect=ReconnectConfig(initial_s=0.05, max_s=0.1))
    caplog.set_level(logging.DEBUG)
    with CameraSource(config) as source:
        reader = threading.Thread(target=lambda: list(source), daemon=True)
        reader.start()
        deadline = time.monotonic() + 20
        while source.stats.retries < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        health = _until_health(source, "no_source")
        source.stop()
        reader.join(10)
    assert health.reason == (f"connection refused by 127.0.0.1:{port}: is the camera (or RTSP "
                             "server) on, and the port right?")
    assert health.retries >= 3 and source.stats.retries >= 3
    raw = capfd.readouterr().err
    assert "[tcp @" not in raw and "Connection to tcp://" not in raw, raw
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(m.startswith("[tcp @ 0x") and "Connection refused" in m for m in debug), debug
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [f"camera rtsp://admin:***@127.0.0.1:{port}/x: {health.reason}; retrying "
                      "with backoff"], warned  # once, not once per retry
    assert "s3cret" not in caplog.text


def test_a_stream_that_is_lost_is_reconnecting_then_running(
        mjpeg: MjpegServer, caplog: pytest.LogCaptureFixture) -> None:
    source = CameraSource(CameraConfig(uri=mjpeg.url, open_timeout_s=2, reconnect=FAST))
    with source:
        frames = iter(source)
        take(source, frames, 2)
        assert source.health() is None  # working: the pipeline says running
        mjpeg.stop()
        reader = threading.Thread(target=lambda: take(source, frames, 1, 30), daemon=True)
        reader.start()
        health = _until_health(source, "reconnecting", "connection refused by 127.0.0.1")
        assert health.retries >= 1
        assert f"camera {mjpeg.url}: read failed: the stream stopped (camera rebooting, or the " \
               "network down?); retrying with backoff" in caplog.text  # how it was lost
        mjpeg.start()
        reader.join(30)
        assert source.health() is None and source.stats.reconnects >= 1


def test_rtsp_path_not_found_is_named(rtsp: RtspServer) -> None:
    uri = f"rtsp://127.0.0.1:{rtsp.port}/nosuchpath"
    config = CameraConfig(uri=uri, open_timeout_s=5,
                          reconnect=ReconnectConfig(initial_s=0.05, max_attempts=1))
    with CameraSource(config) as source:
        health = source.health()
    assert health is not None and health.state == "no_source"
    assert health.reason == (f"404 stream not found on 127.0.0.1:{rtsp.port}: check the stream "
                             "path in the URI")


@pytest.mark.parametrize(("uri", "lines", "reason"), [
    ("rtsp://cam.lan/live", ["[rtsp @ 0x55aa] method DESCRIBE failed: 401 Unauthorized"],
     "401 Unauthorized from cam.lan: check the user name and password in the URI"),
    ("rtsp://cam.lan:8554/live", ["[tcp @ 0x1] Failed to resolve hostname cam.lan: Temporary "
                                  "failure in name resolution"],
     "cannot resolve cam.lan (DNS failure): check the host name, or use the IP address"),
    ("http://10.0.0.9:40123/x", ["[tcp @ 0x1] Connection to tcp://10.0.0.9:40123?timeout=0 "
                                 "failed: Connection refused"],
     "connection refused by 10.0.0.9:40123: is the camera (or RTSP server) on, and the port "
     "right?"),
    ("rtsp://10.0.0.9/live", [], "timed out connecting to 10.0.0.9: is the camera on this "
                                 "network, and the address right?"),
])
def test_ffmpegs_errors_in_words(uri: str, lines: list[str], reason: str) -> None:
    """The FFmpeg lines each failure prints (401 and DNS cannot be made on loopback here)."""
    assert stream_reason(uri, lines, timed_out=not lines) == reason


def test_device_errors_in_words(tmp_path: Path) -> None:
    node = tmp_path / "video5"
    node.write_bytes(b"")
    node.chmod(0)
    if os.access(node, os.R_OK):
        pytest.skip("running as root: permissions do not refuse")
    assert device_reason(str(node)).startswith(f"permission denied on {node}: add the service "
                                               "user to the video group")


def test_credentials_in_the_uri_stay_out_of_names_and_errors() -> None:
    assert redact("rtsp://admin:s3cret@10.0.0.5:554/live") == "rtsp://admin:***@10.0.0.5:554/live"
    assert redact("http://cam.local/mjpg") == "http://cam.local/mjpg" and redact(0) == "0"
    config = CameraConfig(uri="rtsp://admin:s3cret@127.0.0.1:1/x", open_timeout_s=0.5,
                          reconnect=ReconnectConfig(initial_s=0.01, max_attempts=1))
    with CameraSource(config) as source, pytest.raises(SourceError) as info:
        list(source)
    assert "s3cret" not in str(info.value) and "s3cret" not in source.stats.last_error
    assert "admin:***@127.0.0.1:1" in str(info.value)


def test_gstreamer_backend_without_gstreamer_is_refused_at_open() -> None:
    if gstreamer_available():
        pytest.skip("this OpenCV has GStreamer")
    source = CameraSource(CameraConfig(uri="videotestsrc ! appsink", backend="gstreamer"))
    with pytest.raises(SourceError, match="GStreamer"):
        source.__enter__()


# --- picamera2 (a stand-in module: no CSI camera here) --------------------------------------


class FakePicamera2:
    """The part of ``picamera2.Picamera2`` the source uses; records what it was asked."""

    instances: list[FakePicamera2] = []
    fail_opens = 0  # how many of the next constructions fail, as with no camera attached
    fail_after: int | None = None  # captures before one raises, as with a cable pulled

    def __init__(self, camera_num: int = 0) -> None:
        if FakePicamera2.fail_opens:
            FakePicamera2.fail_opens -= 1
            raise RuntimeError("Camera __init__ sequence did not complete.")
        self.camera_num = camera_num
        self.configured: dict[str, Any] | None = None
        self.calls: list[str] = []
        self.captures = 0
        FakePicamera2.instances.append(self)

    def create_video_configuration(self, main: dict[str, Any], controls: dict[str, Any]) -> dict[str, Any]:
        return {"use_case": "video", "main": dict(main), "controls": dict(controls)}

    def configure(self, config: dict[str, Any]) -> None:
        self.configured = config

    def start(self) -> None:
        self.calls.append("start")

    def capture_array(self, name: str = "main", wait: bool | None = None) -> tuple[str, int]:
        assert name == "main" and wait is False
        return ("job", self.captures)

    def wait(self, job: tuple[str, int], timeout: float | None = None) -> np.ndarray:
        assert timeout is not None and timeout > 0
        if FakePicamera2.fail_after is not None and self.captures >= FakePicamera2.fail_after:
            FakePicamera2.fail_after = None
            raise TimeoutError()
        self.captures += 1
        w, h = self.configured["main"]["size"]  # type: ignore[index]
        img = np.zeros((h, w, 3), np.uint8)  # RGB888 is [B, G, R] in memory: blue first
        img[..., 0] = 200
        img[0, 0, 1] = self.captures
        return img

    def stop(self) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture
def fake_picamera2(monkeypatch: pytest.MonkeyPatch) -> type[FakePicamera2]:
    module = types.ModuleType("picamera2")
    module.Picamera2 = FakePicamera2  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "picamera2", module)
    FakePicamera2.instances = []
    FakePicamera2.fail_opens = 0
    FakePicamera2.fail_after = None
    return FakePicamera2


def test_picamera2_configures_and_yields_bgr(fake_picamera2: type[FakePicamera2]) -> None:
    config = Picamera2Config(width=64, height=48, fps=20, camera=1)
    source = open_source(config)
    assert isinstance(source, Picamera2Source)
    with source:
        frames = take(source, iter(source), 3)
    cam = fake_picamera2.instances[0]
    assert cam.camera_num == 1
    assert cam.configured == {"use_case": "video", "main": {"size": (64, 48), "format": "RGB888"},
                              "controls": {"FrameDurationLimits": (50000, 50000)}}
    assert cam.calls == ["start", "stop", "close"]
    assert [f.data.shape for f in frames] == [(48, 64, 3)] * 3
    assert frames[0].data[0, 0, 0] == 200 and frames[0].data[0, 0, 2] == 0  # no channel swap
    assert [int(f.data[0, 0, 1]) for f in frames] == [1, 2, 3]
    assert source.stats.frames == 3


def test_picamera2_reopens_after_capture_failure(fake_picamera2: type[FakePicamera2]) -> None:
    fake_picamera2.fail_opens = 1  # not there at start: _open does not raise
    fake_picamera2.fail_after = 2
    config = Picamera2Config(width=32, height=24, reconnect=FAST)
    with Picamera2Source(config) as source:
        assert source.stats.errors == 1
        frames = take(source, iter(source), 4)
    assert source.stats.errors == 2 and source.stats.reconnects == 2
    assert [f.index for f in frames] == [0, 1, 2, 3]
    first, second = fake_picamera2.instances
    assert first.calls == ["start", "stop", "close"] and second.calls == ["start", "stop", "close"]


def test_picamera2_stop_ends_iteration(fake_picamera2: type[FakePicamera2]) -> None:
    with Picamera2Source(Picamera2Config(width=16, height=16)) as source:
        for i, _ in enumerate(source):
            if i == 2:
                source.stop()
    assert source.stats.frames == 3


def test_picamera2_missing_module_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "picamera2", None)  # makes the import fail
    with pytest.raises(SourceError) as info:
        Picamera2Source(Picamera2Config()).__enter__()
    message = str(info.value)
    assert "sudo apt install python3-picamera2" in message
    assert "--system-site-packages" in message
    assert isinstance(info.value.__cause__, ImportError)


def test_a_node_that_opens_but_gives_no_video_is_named_with_both_likely_causes() -> None:
    config = CameraConfig(uri="/dev/null", reconnect=ReconnectConfig(max_attempts=1))
    with CameraSource(config) as source:
        health = source.health()
    assert health is not None and health.reason == (
        "/dev/null opens but gives no video: another program may hold the camera "
        "(`fuser -v /dev/null`), or it is not a capture node (`v4l2-ctl --list-devices`)")
