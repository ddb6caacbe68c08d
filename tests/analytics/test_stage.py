"""`SceneAnalytics`, the pipeline's analytics step: track ids on detections, zone and line events
as JSON-ready dicts with unique ids and media references, counts, reset, and persistence."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.analytics.stage import SceneAnalytics, media_dir
from edgeinfer.config import parse_config
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Detection, Frame, TaskResult

W, H = 320, 240

CONFIG = """
pipelines:
  - name: door
    model: {path: m.onnx}
    source: {type: synthetic}
    task: {type: detect, decoder: yolov8}
    zones:
      - {name: right, points: [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]], anchor: center}
    lines:
      - {name: gate, points: [[0.5, 0.0], [0.5, 1.0]], anchor: center}
"""


def _pc(extra: str = "", classes: str = "") -> object:
    text = CONFIG + extra
    if classes:
        text = text.replace("anchor: center}", f"anchor: center, classes: {classes}}}")
    return parse_config(text).pipelines[0]


def _frames(n: int, x0: float = 20.0, step: float = 10.0, fps: float = 10.0):  # type: ignore[no-untyped-def]
    image = np.zeros((H, W, 3), np.uint8)
    for i in range(n):
        x = x0 + step * i
        det = Detection("person", 0, 0.9, (x - 10, 100.0, x + 10, 140.0))
        yield Frame(i, 1000.0 + i / fps, time.time(), image, start=i / fps), TaskResult(
            detections=(det,))


def test_tracks_cross_the_line_and_enter_the_zone(tmp_path: Path) -> None:
    analytics = SceneAnalytics(_pc(), class_names=["person"], state_dir=tmp_path)  # type: ignore[arg-type]
    analytics.start()
    events: list[dict[str, object]] = []
    ids: list[int | None] = []
    for frame, part in _frames(30):  # x 20 -> 310: crosses x=160 between frames 13 and 15
        tracked, found = analytics.process(frame, part)
        assert tracked.detections is not None
        ids.append(tracked.detections[0].track_id)
        events.extend(found)
    analytics.close()
    assert set(ids) == {1}  # tracks of the stream's first frame are confirmed at once
    kinds = [(e["type"], e["zone"] or e["line"], e["direction"], e["frame"]) for e in events]
    # A vertical line drawn top to bottom: moving right is crossing from its right to its left.
    # x = 160 at frame 14 is on the line and the zone's edge: the line counts the crossing
    # when the anchor leaves it on the other side; the zone (edge inside) at once.
    assert sorted(kinds) == [("cross", "gate", "out", 15), ("enter", "right", None, 14)]
    cross = next(e for e in events if e["type"] == "cross")
    assert cross["track_id"] == 1 and cross["label"] == "person"
    assert cross["pipeline"] == "door" and str(cross["event_id"]).startswith("door-")
    assert cross["snapshot"] is None and cross["clip"] is None  # no record: section
    assert len({e["event_id"] for e in events}) == len(events)
    assert analytics.counts() == {
        "zones": {"right": {"occupancy": 1, "entered": 1, "exited": 0, "loiter": 0}},
        "lines": {"gate": {"in": 0, "out": 1}}}


def test_counts_persist_and_reset(tmp_path: Path) -> None:
    first = SceneAnalytics(_pc(), class_names=["person"], state_dir=tmp_path)  # type: ignore[arg-type]
    for frame, part in _frames(30):
        first.process(frame, part)
    first.close()
    again = SceneAnalytics(_pc(), class_names=["person"], state_dir=tmp_path)  # type: ignore[arg-type]
    counts = again.counts()
    assert counts is not None and counts["lines"]["gate"] == {"in": 0, "out": 1}
    assert counts["zones"]["right"]["entered"] == 1 and counts["zones"]["right"]["occupancy"] == 0
    assert again.reset(["gate"]) == ["gate"]
    again.close()
    third = SceneAnalytics(_pc(), class_names=["person"], state_dir=tmp_path)  # type: ignore[arg-type]
    counts = third.counts()
    assert counts is not None and counts["lines"]["gate"] == {"in": 0, "out": 0}
    assert counts["zones"]["right"]["entered"] == 1
    with pytest.raises(ValueError, match="nope"):
        third.reset(["nope"])


def test_unknown_class_names_the_yaml_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[3\]\.zones\[0\]\.classes\[0\]"):
        SceneAnalytics(_pc(classes="[persn]"), class_names=["person", "car"],  # type: ignore[arg-type]
                       state_dir=tmp_path, where="$.pipelines[3]")


def test_events_get_snapshot_and_clip_paths(tmp_path: Path) -> None:
    pc = _pc("    record: {clips: {pre_s: 0.5, post_s: 0.5, fps: 10}}\n")
    analytics = SceneAnalytics(pc, class_names=["person"], state_dir=tmp_path)  # type: ignore[arg-type]
    analytics.start()
    events: list[dict[str, object]] = []
    for frame, part in _frames(30):
        events.extend(analytics.process(frame, part)[1])
    analytics.close()
    assert sorted(str(e["type"]) for e in events) == ["cross", "enter"]
    for e in events:
        snapshot, clip = Path(str(e["snapshot"])), Path(str(e["clip"]))
        assert snapshot.parent == media_dir(tmp_path, "door") / "snapshots"
        assert snapshot.is_file() and snapshot.read_bytes()[:2] == b"\xff\xd8"
        assert clip.is_file() and clip.stat().st_size > 0 and e["clip_format"]
        assert analytics.event_snapshot(str(e["event_id"])) == snapshot.read_bytes()
    stats = analytics.stats()
    assert stats["events"] == 2 and stats["media"]["snapshots_written"] == 2


def test_tracking_only_gives_ids_and_no_events(tmp_path: Path) -> None:
    pc = parse_config(CONFIG.split("    zones:")[0] + "    track: {min_hits: 1}\n").pipelines[0]
    analytics = SceneAnalytics(pc, class_names=None, state_dir=tmp_path)
    for frame, part in _frames(5):
        tracked, events = analytics.process(frame, part)
        assert tracked.detections is not None and tracked.detections[0].track_id == 1
        assert events == []
    assert analytics.counts() is None
    with pytest.raises(ValueError, match="no zones or lines"):
        analytics.reset()
    analytics.close()
