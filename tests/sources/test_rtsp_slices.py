"""Pictures in several slices over RTSP (issue 30, item 3): a 1280x720 H.264 file with 2 or 4
slices per picture, served by GStreamer's RTSP server (which repeats SPS/PPS before every slice
of a keyframe, as many cameras do) and read by the PyAV camera source. Every frame handed on
must be its source picture, top and bottom; a picture with a slice missing, and the pictures
predicted from it, are counted corrupt and never handed on. Through OpenCV (no PyAV), such a
camera is refused, naming PyAV."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config import parse_config
from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.errors import SourceError
from edgeinfer.frames import Frame
from edgeinfer.pipeline import Pipeline
from edgeinfer.sources import Source, open_source
from edgeinfer.sources.base import SourceStats
from edgeinfer.sources.isolated import ProcessSource
from edgeinfer.testing.detector_models import conv_detector_model
from edgeinfer.testing.streams import APT_PACKAGES, RtspServer, rtsp_available, write_h264

av = pytest.importorskip("av", reason="PyAV is not installed (pip install 'edgeinfer[rtsp]')")

from av.bitstream import BitStreamFilterContext  # noqa: E402  (needs av)

from edgeinfer.sources.pictures import Pictures  # noqa: E402  (needs av)

FAST = ReconnectConfig(initial_s=0.05, max_s=0.2)
W, H, FPS, GOP, N = 1280, 720, 15, 15, 45
STEP = 8  # compare every 8th pixel: enough to see a wrong half, cheap on a busy box
MAX_ERROR = 6.0  # mean absolute difference of a half; a right one is ~2 (compression)


def _need() -> None:
    why = rtsp_available(codec="file")
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")


def _scene() -> list[np.ndarray]:
    """A gradient, a white square crossing the top half and a red one the bottom half, each
    at another place in every picture (so each picture is told apart by either half)."""
    ramp = np.linspace(30, 200, W, dtype=np.float32)
    base = np.empty((H, W, 3), np.uint8)
    base[:] = np.stack([ramp, ramp[::-1], np.full(W, 90, np.float32)], axis=1).astype(np.uint8)
    images = []
    for i in range(N):
        img = base.copy()
        img[100:250, 40 + 20 * i:190 + 20 * i] = (255, 255, 255)
        img[450:600, 1100 - 20 * i:1250 - 20 * i] = (0, 0, 255)
        images.append(img)
    return images


def _which(frame: np.ndarray, small: np.ndarray) -> tuple[int, float, float]:
    """The source picture ``frame`` is closest to, and the error of its top and bottom half."""
    got = frame[::STEP, ::STEP].astype(np.int16)
    diff = np.abs(small - got[None]).mean(axis=3)  # (N, h, w)
    half = diff.shape[1] // 2
    top, bottom = diff[:, :half].mean(axis=(1, 2)), diff[:, half:].mean(axis=(1, 2))
    k = int(np.argmin(top + bottom))
    return k, float(top[k]), float(bottom[k])


def _take(source: Source, n: int, timeout_s: float = 40.0) -> list[Frame]:
    got: list[Frame] = []
    watchdog = threading.Timer(timeout_s, source.stop)
    watchdog.start()
    try:
        for frame in source:
            got.append(frame)
            if len(got) == n:
                return got
    finally:
        watchdog.cancel()
    raise AssertionError(f"only {len(got)} of {n} frames in {timeout_s} s")


def _slices(path: Path, picture: int) -> list[int]:
    """The first macroblock of each slice of ``path``'s ``picture`` (the file's AVCC)."""
    with av.open(str(path)) as f:
        data = bytes(next(p for i, p in enumerate(f.demux(video=0)) if i == picture))
    out, i = [], 0
    while i + 4 <= len(data):
        size = int.from_bytes(data[i:i + 4], "big")
        if data[i + 4] & 0x1F in (1, 5):
            out.append(data[i + 5] >> 7)  # 1: the slice starts at macroblock 0
        i += 4 + size
    return out


def _without_slices(src: Path, dst: Path, drop: dict[int, int]) -> Path:
    """``src`` with slice ``drop[k]`` of picture ``k`` left out (a camera whose packets got
    lost on the way), remuxed as it is."""
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="mp4") as out:
        video = inp.streams.video[0]
        stream = out.add_stream_from_template(video)
        for k, packet in enumerate(p for p in inp.demux(video) if p.size):
            data = bytes(packet)
            if k in drop:
                units, i = [], 0
                while i + 4 <= len(data):
                    size = int.from_bytes(data[i:i + 4], "big")
                    units.append(data[i:i + 4 + size])
                    i += 4 + size
                victim = [u for u in units if u[4] & 0x1F in (1, 5)][drop[k]]
                data = b"".join(u for u in units if u is not victim)
            copy = av.Packet(data)
            copy.pts, copy.dts, copy.time_base = packet.pts, packet.dts, packet.time_base
            copy.is_keyframe = packet.is_keyframe
            copy.stream = stream
            out.mux(copy)
    return dst


@pytest.fixture(scope="module")
def scene() -> tuple[list[np.ndarray], np.ndarray]:
    images = _scene()
    return images, np.stack([img[::STEP, ::STEP] for img in images]).astype(np.int16)


@pytest.mark.parametrize("slices", [2, 4])
def test_every_picture_of_a_multi_slice_camera_decodes_whole(
        tmp_path: Path, scene: tuple[list[np.ndarray], np.ndarray], slices: int) -> None:
    _need()
    images, small = scene
    path = write_h264(tmp_path / "sliced.mp4", images, fps=FPS, gop=GOP, slices=slices)
    assert len(_slices(path, 3)) == slices and len(_slices(path, 0)) == slices
    with RtspServer(file=path) as server:
        source = open_source(CameraConfig(uri=server.url, open_timeout_s=10, reconnect=FAST))
        with source:
            frames = _take(source, 50)  # past 3 keyframes, 46 P-frames or more
    seen = [_which(f.data, small) for f in frames]
    wrong = [(f.index, k, round(top, 1), round(bottom, 1))
             for f, (k, top, bottom) in zip(frames, seen, strict=True)
             if top > MAX_ERROR or bottom > MAX_ERROR]
    assert not wrong, f"{len(wrong)} of {len(frames)} frames not whole (index, picture, " \
                      f"top error, bottom error): {wrong[:8]}"
    assert len({k for k, _, _ in seen}) >= 40  # the pictures, not a few of them repeated
    assert source.stats.corrupt == 0 and source.health() is None


def test_a_picture_with_a_slice_lost_is_counted_corrupt_and_never_handed_on(
        tmp_path: Path, scene: tuple[list[np.ndarray], np.ndarray]) -> None:
    _need()
    images, small = scene
    whole = write_h264(tmp_path / "whole.mp4", images, fps=FPS, gop=GOP, slices=2)
    # Picture 5 loses its top slice, picture 20 its bottom one (keyframes: 0, 15, 30): each
    # breaks itself and the pictures predicted from it, up to the next keyframe.
    path = _without_slices(whole, tmp_path / "lossy.mp4", {5: 0, 20: 1})
    broken = set(range(5, 15)) | set(range(20, 30))
    with RtspServer(file=path) as server:
        source = open_source(CameraConfig(uri=server.url, open_timeout_s=10, reconnect=FAST))
        with source:
            frames = _take(source, 40)  # 40 whole pictures: the file's 25 and more, looping
            health = source.health()
    seen = [_which(f.data, small) for f in frames]
    wrong = [(k, round(top, 1), round(bottom, 1)) for k, top, bottom in seen
             if top > MAX_ERROR or bottom > MAX_ERROR or k in broken]
    assert not wrong, f"broken pictures handed on (picture, top error, bottom error): {wrong}"
    assert {k for k, _, _ in seen} >= set(range(30, 45)) | {15, 19}
    assert source.stats.corrupt >= 20, source.stats.to_dict()  # one loop's broken pictures
    assert health is not None and health.state == "running", health
    assert "corrupt" in health.reason and "transport: tcp" in health.reason
    assert "slices missing" in source.stats.last_error


@pytest.mark.parametrize("slices", [1, 2])
def test_opencv_refuses_a_camera_whose_pictures_come_in_pieces(
        tmp_path: Path, scene: tuple[list[np.ndarray], np.ndarray], slices: int) -> None:
    """Without PyAV (OpenCV's FFmpeg): a 2-slice keyframe is decoded as two pictures, each
    half concealed, and the P-frames after it stay half wrong; OpenCV can neither join nor
    flag them, so the stream is refused naming PyAV, with no frame handed on. One slice
    per picture reads whole."""
    _need()
    images, small = scene
    path = write_h264(tmp_path / "sliced.mp4", images, fps=FPS, gop=GOP, slices=slices)
    with RtspServer(file=path) as server:
        source = open_source(CameraConfig(uri=server.url, backend="ffmpeg", open_timeout_s=10,
                                          reconnect=FAST))
        # in a capture process (what auto builds): its refusal reaches the pipeline's side
        assert isinstance(source, ProcessSource) and source.reader == "opencv"
        with source:
            if slices > 1:
                got: list[Frame] = []
                watchdog = threading.Timer(20.0, source.stop)  # a stream read on: fail, not hang
                watchdog.start()
                try:
                    with pytest.raises(SourceError, match=r"several slices.*edgeinfer\[rtsp\]"):
                        got.extend(source)
                finally:
                    watchdog.cancel()
                assert not got and source.stats.corrupt >= 1
                return
            frames = _take(source, 30)
    seen = [_which(f.data, small) for f in frames]
    assert all(top <= MAX_ERROR and bottom <= MAX_ERROR for _, top, bottom in seen), seen
    assert source.stats.corrupt == 0


def test_a_pipeline_detects_only_on_whole_frames_and_its_health_says_why(
        tmp_path: Path, scene: tuple[list[np.ndarray], np.ndarray]) -> None:
    """The lossy camera under a detector: every result's frame is a whole picture, the broken
    ones are on the pipeline's stats (``source.corrupt``) and its health (running, why)."""
    _need()
    images, small = scene
    whole = write_h264(tmp_path / "whole.mp4", images, fps=FPS, gop=GOP, slices=2)
    path = _without_slices(whole, tmp_path / "lossy.mp4", {5: 0, 20: 1})
    broken = set(range(5, 15)) | set(range(20, 30))
    model = conv_detector_model(tmp_path / "det.onnx", size=64)
    with RtspServer(file=path) as server:
        config = parse_config(
            f"runtime: {{state_dir: '{tmp_path}'}}\n"
            "pipelines:\n  - name: cam\n"
            f"    source: {{type: camera, uri: '{server.url}', open_timeout_s: 10}}\n"
            f"    model: {{path: '{model}'}}\n"
            "    task: {type: detect, decoder: yolov8, labels: [red, green]}\n",
            base_dir=tmp_path)
        pipeline = Pipeline.from_config(config)
        watchdog = threading.Timer(60.0, pipeline.stop)
        watchdog.start()
        results, health, snapshot = [], None, {}
        try:
            for result in pipeline:
                results.append(result)
                if len(results) >= 30 and pipeline.source.stats.corrupt >= 20:
                    health, snapshot = pipeline.health(), pipeline.snapshot()
                    break
        finally:
            watchdog.cancel()
            pipeline.close()
    assert health is not None, f"{len(results)} results, {pipeline.source.stats.to_dict()}"
    seen = [_which(r.frame.data, small) for r in results]
    assert not [s for s in seen if s[0] in broken or max(s[1:]) > MAX_ERROR], seen
    assert health.state == "running" and "corrupt" in health.reason, health
    assert snapshot["source"]["corrupt"] >= 20 and snapshot["health"]["reason"] == health.reason


def test_a_stream_that_splits_every_picture_is_joined_once_it_shows(
        tmp_path: Path, scene: tuple[list[np.ndarray], np.ndarray]) -> None:
    """Every picture in two packets of one pts (a camera that repeats SEI before each slice,
    say): keyframes wait for the next packet from the start; the first split P-frame is seen
    too late (decoded without its second half: counted corrupt with the pictures predicted
    from it), and from then on every picture waits and decodes whole. A picture whose first
    packet is lost is not joined to the picture before it (another pts): counted corrupt."""
    images, small = scene
    path = write_h264(tmp_path / "sliced.mp4", images, fps=FPS, gop=GOP, slices=2)
    stats = SourceStats()
    out: list[tuple[int, float, float]] = []
    with av.open(str(path)) as f:
        video = f.streams.video[0]
        annexb = BitStreamFilterContext("h264_mp4toannexb", video)
        pictures = Pictures(video.codec_context, stats, "test")
        for packet in (q for p in f.demux(video) if p.size for q in annexb.filter(p)):
            data = bytes(packet)
            cut = data.rfind(b"\0\0\1")  # the second slice's start code
            cut -= data[cut - 1] == 0  # a 4-byte one
            for i, part in enumerate((data[:cut], data[cut:])):
                if packet.pts // (packet.duration or 1) == 20 and i == 0:
                    continue  # picture 20's first packet is lost: its second is not joined
                piece = av.Packet(part)
                piece.pts, piece.dts, piece.time_base = packet.pts, packet.dts, packet.time_base
                piece.is_keyframe = packet.is_keyframe and i == 0  # as FFmpeg's parser says
                out.extend(_which(frame.to_ndarray(format="bgr24"), small)
                           for frame in pictures.decode(piece))
        out.extend(_which(frame.to_ndarray(format="bgr24"), small) for frame in pictures.flush())
    assert all(top <= MAX_ERROR and bottom <= MAX_ERROR for _, top, bottom in out), out
    # Picture 1 is the first split P-frame: it and 2-14 are left out, and 20-29 (20 lost its
    # first packet); the rest are all there.
    assert [k for k, _, _ in out] == [0, *range(15, 20), *range(30, N)]
    assert stats.corrupt == 14 + 10
