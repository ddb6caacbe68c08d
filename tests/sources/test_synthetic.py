"""The ``synthetic`` source: count, shape, dtype, moving content, pacing and stop."""

from __future__ import annotations

import threading
import time

import numpy as np

from edgeinfer.config.pipeline import SyntheticSource as SyntheticConfig
from edgeinfer.sources import open_source
from edgeinfer.sources.synthetic import SyntheticSource, TestPattern


def test_frames_limit_shape_dtype_and_moving_content() -> None:
    source = open_source(SyntheticConfig(width=64, height=48, fps=1000, frames=12))
    assert isinstance(source, SyntheticSource) and source.live
    assert source.name == "synthetic:64x48@1000"
    with source:
        frames = list(source)
    assert len(frames) == 12 == source.stats.frames
    assert [f.index for f in frames] == list(range(12))
    assert all(f.data.shape == (48, 64, 3) and f.data.dtype == np.uint8 and f.kind == "image"
               for f in frames)
    assert all(f.data.flags.c_contiguous for f in frames)
    for a, b in zip(frames, frames[1:]):
        assert not np.array_equal(a.data, b.data)
        assert b.ts >= a.ts
    assert not np.shares_memory(frames[0].data, frames[1].data)  # safe to keep or hand on


def test_fps_paces_the_stream() -> None:
    t0 = time.monotonic()
    with SyntheticSource(SyntheticConfig(width=32, height=32, fps=50, frames=15)) as source:
        frames = list(source)
    assert len(frames) == 15
    # Lower bound only; RateLimiter.pace lets up to two intervals of catch-up through at start.
    assert time.monotonic() - t0 >= 12 / 50 * 0.95


def test_stop_from_another_thread_ends_an_endless_stream() -> None:
    with SyntheticSource(SyntheticConfig(width=32, height=24, fps=100)) as source:
        threading.Timer(0.1, source.stop).start()
        t0 = time.monotonic()
        count = sum(1 for _ in source)
    assert time.monotonic() - t0 < 20.0  # an endless stream: stop() ended it
    assert count == source.stats.frames > 0


def test_pattern_is_deterministic_and_handles_tiny_frames() -> None:
    assert np.array_equal(TestPattern(40, 30).draw(7), TestPattern(40, 30).draw(7))
    assert TestPattern(1, 1).draw(3).shape == (1, 1, 3)
