"""The demo clip is replaced whole: a reader never sees half of it."""

from __future__ import annotations

from pathlib import Path

import cv2
import pytest

from edgeinfer.errors import SourceError
from edgeinfer.model.samples import demo_video


def _frames(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    try:
        n = 0
        while cap.read()[0]:
            n += 1
        return n
    finally:
        cap.release()


def test_rewriting_the_clip_leaves_an_open_reader_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "demo.mp4"
    demo_video(out, frames=12, size=(160, 120))
    old = out.read_bytes()
    with out.open("rb") as reader:  # another `edgeinfer demo` reading it now
        demo_video(out, frames=20, size=(160, 120))
        assert reader.read() == old  # renamed over, not truncated and rewritten under it
    assert _frames(out) == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.mp4"]  # no part file left


def test_a_failed_write_leaves_no_part_file_and_the_old_clip(tmp_path: Path) -> None:
    out = tmp_path / "demo.mp4"
    demo_video(out, frames=3, size=(160, 120))
    with pytest.raises(SourceError, match="OpenCV cannot write video"):
        demo_video(out, frames=3, size=(0, 0))  # a writer OpenCV cannot open
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.mp4"]
    assert _frames(out) == 3
