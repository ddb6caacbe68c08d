"""A ``video`` file read ahead in a capture process (``isolation: process``; ``auto`` reads
it in the pipeline's thread): the same frames as in the pipeline's thread, every one, in
order, with their stream times, even behind a slow consumer holding frames (the child waits for
a free slot; nothing is skipped); a missing file is refused at start, as in-process; a crash
ends the stream with the reason instead of reading the file again."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer import samples
from edgeinfer.config.pipeline import VideoSource as VideoConfig
from edgeinfer.errors import SourceError
from edgeinfer.frames import Frame
from edgeinfer.sources import Source, open_source
from edgeinfer.sources.files import VideoSource
from edgeinfer.sources.isolated import ProcessSource


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.demo_video(tmp_path_factory.mktemp("clip") / "clip.avi", frames=40,
                              size=(320, 240))


def _read(source: Source, pause_s: float = 0.0) -> list[Frame]:
    """Every frame, each one held to the end; a watchdog stops a source that hangs."""
    frames: list[Frame] = []
    watchdog = threading.Timer(30.0, source.stop)
    watchdog.start()
    try:
        with source:
            for frame in source:
                frames.append(frame)
                if pause_s:
                    time.sleep(pause_s)
    finally:
        watchdog.cancel()
    return frames


def test_the_same_frames_as_in_process_every_one_behind_a_slow_holder(clip: Path) -> None:
    assert isinstance(open_source(VideoConfig(uri=str(clip))), VideoSource)  # auto: thread
    here = _read(open_source(VideoConfig(uri=str(clip), isolation="thread")))
    # every frame held to the end (more than the ring's slots) and read slowly at first
    there = _read(open_source(VideoConfig(uri=str(clip), isolation="process")), pause_s=0.002)
    assert len(here) == len(there) == 40
    for a, b in zip(here, there, strict=True):
        assert (a.index, a.start) == (b.index, b.start)
        assert np.array_equal(a.data, b.data)


def test_a_missing_file_is_refused_at_start(tmp_path: Path) -> None:
    source = open_source(VideoConfig(uri=str(tmp_path / "none.mp4"), isolation="process"))
    with pytest.raises(SourceError, match="no such file"):
        source.__enter__()
    source.__exit__(None, None, None)


def test_a_crash_ends_the_file_with_the_reason(clip: Path) -> None:
    source = open_source(VideoConfig(uri=str(clip), isolation="process", fps=20))
    assert isinstance(source, ProcessSource)
    got: list[Frame] = []
    with source, pytest.raises(SourceError, match=r"capture process crashed \(SIGSEGV\)"):
        for frame in source:
            got.append(frame)
            if len(got) == 5:
                assert source.pid is not None
                os.kill(source.pid, signal.SIGSEGV)
    assert 5 <= len(got) < 40
