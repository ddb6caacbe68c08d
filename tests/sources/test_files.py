"""The ``video`` and ``images`` sources on files written by OpenCV: complete reads, looping, pacing,
and damaged input (truncated or corrupted video, non-images and truncated JPEGs in a folder)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgeinfer.config.pipeline import ImagesSource as ImagesConfig
from edgeinfer.config.pipeline import VideoSource as VideoConfig
from edgeinfer.errors import SourceError
from edgeinfer.sources import open_source
from edgeinfer.sources.files import ImagesSource, VideoSource

W, H, N = 96, 64, 24


def numbered(i: int) -> np.ndarray:
    """Frame ``i``: a flat colour that encodes ``i``, so order survives lossy compression."""
    img = np.zeros((H, W, 3), np.uint8)
    img[:] = (10 * i % 256, 128, 255 - 10 * i % 256)
    return img


def write_video(path: Path, fourcc: str, n: int = N) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 25.0, (W, H))
    assert writer.isOpened(), f"OpenCV cannot write {fourcc} to {path.suffix}"
    for i in range(n):
        writer.write(numbered(i))
    writer.release()
    return path


@pytest.fixture(scope="module")
def avi(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "clip.avi", "MJPG")


@pytest.fixture(scope="module")
def mp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_video(tmp_path_factory.mktemp("video") / "clip.mp4", "mp4v")


def read_all(source: VideoSource | ImagesSource, limit: int = 1000) -> list:
    frames = []
    with source:
        for frame in source:
            frames.append(frame)
            assert len(frames) <= limit, "the source did not end"
    return frames


# --- video -------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", ["avi", "mp4"])
def test_video_reads_every_frame_in_order(clip: str, request: pytest.FixtureRequest) -> None:
    path = request.getfixturevalue(clip)
    source = open_source(VideoConfig(uri=str(path)))
    assert isinstance(source, VideoSource) and not source.live and source.name == str(path)
    frames = read_all(source)
    assert len(frames) == N == source.stats.frames
    assert [f.index for f in frames] == list(range(N))
    assert all(f.data.shape == (H, W, 3) and f.data.dtype == np.uint8 for f in frames)
    blue = [int(f.data[H // 2, W // 2, 0]) for f in frames]
    assert all(abs(b - 10 * i % 256) <= 12 for i, b in enumerate(blue)), blue
    assert source.stats.corrupt == source.stats.skipped == 0


def test_video_loop_keeps_counting(avi: Path) -> None:
    with VideoSource(VideoConfig(uri=str(avi), loop=True)) as source:
        frames = []
        for frame in source:
            frames.append(frame)
            if len(frames) == 2 * N + 5:
                source.stop()
    assert [f.index for f in frames] == list(range(2 * N + 5))
    assert np.array_equal(frames[N].data, frames[0].data)  # back at the first frame


def test_video_fps_paces_reading(avi: Path) -> None:
    t0 = time.monotonic()
    frames = read_all(VideoSource(VideoConfig(uri=str(avi), fps=60)))
    elapsed = time.monotonic() - t0
    assert len(frames) == N
    # Lower bound only (a busy machine is slower, never faster); RateLimiter.pace lets up to
    # two intervals of catch-up through at the start.
    assert elapsed >= (N - 3) / 60 * 0.95


def test_video_missing_or_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    with pytest.raises(SourceError, match="nope.mp4"):
        VideoSource(VideoConfig(uri=str(missing))).__enter__()
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all " * 200)
    with pytest.raises(SourceError, match="junk.mp4"):
        VideoSource(VideoConfig(uri=str(junk))).__enter__()


def test_truncated_avi_ends_cleanly_and_counts_the_missing_frames(
        avi: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = avi.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[: len(data) // 2])
    source = VideoSource(VideoConfig(uri=str(cut)))
    with caplog.at_level(logging.WARNING, logger="edgeinfer.sources.files"):
        frames = read_all(source)
    assert 0 < len(frames) == source.stats.frames < N
    # OpenCV's AVI header announces all N frames; those the file no longer has count as corrupt.
    assert source.stats.frames + source.stats.corrupt == N
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "truncated" in warnings[0]


def test_truncated_mp4_cannot_be_opened(mp4: Path, tmp_path: Path) -> None:
    data = mp4.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) // 2])  # the index (moov) is written last: gone
    with pytest.raises(SourceError, match="cut.mp4"):
        VideoSource(VideoConfig(uri=str(cut))).__enter__()


def test_damage_in_the_middle_is_skipped_and_counted(avi: Path, tmp_path: Path) -> None:
    data = bytearray(avi.read_bytes())
    start, length = len(data) * 2 // 5, len(data) // 8
    data[start:start + length] = np.random.default_rng(0).integers(0, 256, length, np.uint8).tobytes()
    bad = tmp_path / "bad.avi"
    bad.write_bytes(bytes(data))
    source = VideoSource(VideoConfig(uri=str(bad)))
    frames = read_all(source)  # FFmpeg drops the damaged frames; nothing raises
    assert N // 2 < source.stats.frames == len(frames) < N
    assert [f.index for f in frames] == list(range(len(frames)))
    assert source.stats.frames + source.stats.corrupt == N
    # The last frames of the file still arrive, once each (no seek back into delivered ones).
    blue = [int(f.data[H // 2, W // 2, 0]) for f in frames]
    assert abs(blue[-1] - 10 * (N - 1)) <= 12 and len(set(blue[-4:])) == 4


# --- images ------------------------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "images"
    d.mkdir()
    for i, name in enumerate(["c.png", "a.jpg", "b.png"]):
        cv2.imwrite(str(d / name), numbered(i * 5))
    good = (d / "a.jpg").read_bytes()
    (d / "d_truncated.jpg").write_bytes(good[: len(good) // 2])
    (d / "e_text.jpg").write_text("this is not a JPEG\n")
    (d / "notes.txt").write_text("labels, not an image\n")
    (d / ".hidden.png").write_bytes(b"ignored")
    return d


def test_images_in_sorted_order_with_bad_files_counted(folder: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    source = open_source(ImagesConfig(uri=str(folder)))
    assert isinstance(source, ImagesSource) and not source.live
    with caplog.at_level(logging.WARNING, logger="edgeinfer.sources.files"):
        frames = read_all(source)
    assert [int(f.data[0, 0, 0]) for f in frames] == pytest.approx([50, 100, 0], abs=6)  # a, b, c
    assert all(f.data.shape == (H, W, 3) for f in frames)
    assert [f.index for f in frames] == [0, 1, 2]
    assert source.stats.frames == 3 and source.stats.corrupt == 3
    skipped = sorted(r.getMessage().split("skipping ")[1].split(":")[0] for r in caplog.records)
    assert skipped == ["d_truncated.jpg", "e_text.jpg", "notes.txt"]


def test_images_loop_reads_bad_files_once(folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.sources.files"):
        with ImagesSource(ImagesConfig(uri=str(folder), loop=True, fps=200)) as source:
            frames = []
            for frame in source:
                frames.append(frame)
                if len(frames) == 7:
                    source.stop()
    assert len(frames) == 7 and source.stats.corrupt == 3
    assert len(caplog.records) == 3  # one warning per bad file, not per pass


def test_images_glob(folder: Path) -> None:
    frames = read_all(ImagesSource(ImagesConfig(uri=str(folder / "*.png"))))
    assert [int(f.data[0, 0, 0]) for f in frames] == pytest.approx([100, 0], abs=3)  # b, c


def test_images_empty_or_missing_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no image files"):
        ImagesSource(ImagesConfig(uri=str(tmp_path))).__enter__()
    with pytest.raises(SourceError, match="missing"):
        ImagesSource(ImagesConfig(uri=str(tmp_path / "missing"))).__enter__()
    (tmp_path / "only.jpg").write_text("nope")
    source = ImagesSource(ImagesConfig(uri=str(tmp_path)))
    with source, pytest.raises(SourceError, match="could be decoded"):
        list(source)
