"""The decoder seam (``sources/decoders.py``): a camera's H.264 decoded by the board's hardware
decoder when one opens and decodes a probe, else by FFmpeg's software decoder, with a log line
either way. This machine has no hardware decoder: the software path and the fallbacks run for
real (GStreamer's RTSP server on loopback); a hardware decoder that opens is stood in for by a
second software decoder (one that decodes: the trial passes; one of another codec: it fails)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator

import av
import numpy as np
import pytest

from edgeinfer.config import parse_config
from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Frame
from edgeinfer.sources import decoders
from edgeinfer.sources.rtsp import PyAvSource
from edgeinfer.testing.streams import APT_PACKAGES, RtspServer, rtsp_available

FAST = ReconnectConfig(initial_s=0.05, max_s=0.2)


@pytest.fixture(scope="module")
def h264() -> Iterator[RtspServer]:
    why = rtsp_available(codec="h264")
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")
    with RtspServer(width=320, height=240, fps=15, codec="h264", gop=15) as server:
        yield server


def _take(source: PyAvSource, n: int) -> list[Frame]:
    got: list[Frame] = []
    watchdog = threading.Timer(20.0, source.stop)
    watchdog.start()
    try:
        for frame in source:
            got.append(frame)
            if len(got) == n:
                break
    finally:
        watchdog.cancel()
    assert len(got) == n, f"only {len(got)} of {n} frames"
    return got


def _pattern_ok(frames: list[Frame]) -> None:
    """GStreamer's ``ball`` pattern decoded whole: a white ball on black (a concealed
    picture is grey or green)."""
    for f in frames:
        assert f.data.shape == (240, 320, 3)
        assert int(f.data.max()) > 200 and float(np.median(f.data)) < 30, f.index


def test_auto_decodes_in_software_here_and_says_why(
        h264: RtspServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "edgeinfer.sources.camera")
    with PyAvSource(CameraConfig(uri=h264.url, isolation="thread", reconnect=FAST)) as source:
        frames = _take(source, 10)
    _pattern_ok(frames)
    assert source.stats.to_dict()["decoder"] == "h264 (software)"
    said = [r.getMessage() for r in caplog.records if "decoding h264 in software" in
            r.getMessage()]
    assert len(said) == 1 and "V4L2 M2M: no V4L2 memory-to-memory decoder" in said[0], said
    assert all(r.levelno == logging.INFO for r in caplog.records if "software" in r.getMessage())


def test_a_named_hardware_decoder_that_does_not_open_falls_back_with_a_warning(
        h264: RtspServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "edgeinfer.sources.camera")
    config = CameraConfig(uri=h264.url, decoder="v4l2m2m", isolation="thread", reconnect=FAST)
    with PyAvSource(config) as source:
        frames = _take(source, 10)
    _pattern_ok(frames)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("h264_v4l2m2m did not open" in w and "decoding h264 in software" in w
               for w in warned), warned


def _stand_in(codec: str) -> object:
    def fake_open(hw: decoders.Hardware, stream: av.VideoCodecContext) -> av.VideoCodecContext:
        ctx = av.CodecContext.create(codec, "r")
        assert isinstance(ctx, av.VideoCodecContext)
        if codec == stream.name and stream.extradata:
            ctx.extradata = stream.extradata
        ctx.open()
        return ctx

    return fake_open


def test_a_hardware_decoder_that_decodes_passes_its_trial(
        h264: RtspServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, "edgeinfer.sources.camera")
    monkeypatch.setattr(decoders, "present", lambda kind: None if kind == "v4l2m2m" else "no")
    monkeypatch.setattr(decoders, "_open", _stand_in("h264"))
    with PyAvSource(CameraConfig(uri=h264.url, isolation="thread", reconnect=FAST)) as source:
        frames = _take(source, 10)
    _pattern_ok(frames)
    assert source.stats.to_dict()["decoder"] == "h264_v4l2m2m (V4L2 M2M, hardware)"
    assert any("decoding with h264_v4l2m2m (V4L2 M2M, hardware): its first picture decoded"
               in r.getMessage() for r in caplog.records)


def test_a_hardware_decoder_that_opens_but_decodes_nothing_hands_over_losing_no_frame(
        h264: RtspServer, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in is an HEVC decoder fed H.264: it opens, and gives no picture. The packets
    it was given are decoded again in software: the first frames are not lost."""
    caplog.set_level(logging.INFO, "edgeinfer.sources.camera")
    monkeypatch.setattr(decoders, "present", lambda kind: None if kind == "nvdec" else "no")
    monkeypatch.setattr(decoders, "_open", _stand_in("hevc"))
    with PyAvSource(CameraConfig(uri=h264.url, isolation="thread", reconnect=FAST)) as source:
        frames = _take(source, 25)
    _pattern_ok(frames)
    assert [f.index for f in frames] == list(range(25))  # none lost to the trial
    decoder = source.stats.to_dict()["decoder"]
    assert decoder.startswith("h264 (software; h264_cuvid failed: "), decoder
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("h264_cuvid (NVDEC, hardware) opened but did not decode the stream" in w
               for w in warned), warned


def test_a_hardware_decoder_needs_a_stream_read_through_pyav() -> None:
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[0\]\.source.*decoder: v4l2m2m "
                                          r"decodes streams through PyAV"):
        parse_config('{"pipelines": [{"name": "p", "model": {"path": "m.onnx"}, '
                     '"task": {"type": "detect"}, "source": {"type": "camera", '
                     '"uri": "/dev/video0", "decoder": "v4l2m2m"}}]}')
