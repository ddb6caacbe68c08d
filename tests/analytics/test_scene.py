"""Scene: zone enter/exit/loiter with debounce, line crossings, class filters, config errors."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
import pytest

from edgeinfer.analytics.scene import Scene, SceneEvent
from edgeinfer.analytics.tracker import ByteTracker
from edgeinfer.config.analytics import LineConfig, TrackConfig, ZoneConfig
from edgeinfer.errors import ConfigError, StateError

LABELS = ["person", "car"]
SQUARE = [[100, 100], [300, 100], [300, 300], [100, 300]]
Obj = tuple[int, float, float] | tuple[int, float, float, int]


def clock(frame: int) -> float:
    return frame * 0.25


def wall(frame: int) -> float:
    return 1_700_000_000.0 + frame * 0.25


def feed(scene: Scene, frame: int, objs: Sequence[Obj], ended: Sequence[int] = ()
         ) -> list[SceneEvent]:
    """One frame: each object is (track id, anchor x, anchor y[, class]); boxes are 20x40 with
    their bottom centre on the anchor."""
    ids = np.array([o[0] for o in objs], dtype=np.int64)
    boxes = np.array([[o[1] - 10, o[2] - 40, o[1] + 10, o[2]] for o in objs],
                     dtype=np.float32).reshape(-1, 4)
    classes = np.array([o[3] if len(o) > 3 else 0 for o in objs], dtype=np.int64)
    scores = np.full(len(objs), 0.5 + frame / 1000, dtype=np.float32)
    labels = [LABELS[int(c)] for c in classes]
    return scene.update(clock(frame), wall(frame), frame, ids, boxes, classes, scores, labels,
                        ended)


def zone_scene(**kw: object) -> Scene:
    scene = Scene([ZoneConfig(name="z", points=SQUARE, coordinates="pixels", **kw)], [],
                  class_names=LABELS)
    scene.bind(640, 480)
    return scene


def run(scene: Scene, path: Sequence[tuple[float, float] | None], tid: int = 1,
        first: int = 0) -> list[SceneEvent]:
    """Move one object along ``path`` (``None``: not detected in that frame)."""
    events: list[SceneEvent] = []
    for k, p in enumerate(path):
        events += feed(scene, first + k, [] if p is None else [(tid, *p)])
    return events


IN, OUT = (200.0, 200.0), (400.0, 200.0)


def test_enter_exit_min_frames_1() -> None:
    scene = zone_scene()
    events = run(scene, [OUT, OUT, IN, IN, IN, IN, OUT, OUT])
    assert [(e.type, e.frame) for e in events] == [("enter", 2), ("exit", 6)]
    enter, leave = events
    assert (enter.start, enter.t_start, enter.end, enter.dwell_s) == (wall(2), clock(2), None,
                                                                      None)
    assert (leave.start, leave.end, leave.t_start, leave.clock) == (wall(2), wall(6), clock(2),
                                                                    clock(6))
    assert leave.dwell_s == pytest.approx(clock(6) - clock(2))
    assert (enter.zone, enter.line, enter.track_id, enter.label, enter.class_id) == (
        "z", None, 1, "person", 0)
    assert enter.score == pytest.approx(0.502)
    assert scene.counts()["zones"]["z"] == {"occupancy": 0, "entered": 1, "exited": 1,
                                            "loiter": 0}


def test_enter_exit_min_frames_3_debounces() -> None:
    scene = zone_scene(min_frames=3)
    # In from frame 2; one frame out at 7 (jitter) is no exit; out for good from frame 10.
    path = [OUT, OUT, IN, IN, IN, IN, IN, OUT, IN, IN, OUT, OUT, OUT, OUT]
    events = run(scene, path)
    assert [(e.type, e.frame) for e in events] == [("enter", 4), ("exit", 12)]
    enter, leave = events
    assert (enter.start, enter.t_start, enter.clock) == (wall(2), clock(2), clock(4))
    assert (leave.start, leave.end) == (wall(2), wall(10))
    assert leave.dwell_s == pytest.approx(clock(10) - clock(2))


def test_occupancy_with_several_objects() -> None:
    scene = zone_scene()
    feed(scene, 0, [(1, *IN), (2, *IN), (3, *OUT), (-1, *IN)])
    assert scene.counts()["zones"]["z"]["occupancy"] == 2
    feed(scene, 1, [(1, *IN), (2, *OUT), (3, *IN), (4, 150, 150)])
    assert scene.counts()["zones"]["z"] == {"occupancy": 3, "entered": 4, "exited": 1,
                                            "loiter": 0}
    assert not scene.changed
    feed(scene, 2, [(1, *IN), (2, *OUT), (3, *IN), (4, 150, 150)])
    assert not scene.changed


def test_loiter_once_per_visit_and_again_after_reentering() -> None:
    scene = zone_scene(loiter_s=1.0)
    events = run(scene, [OUT] + [IN] * 10 + [OUT] * 2 + [IN] * 6)
    assert [(e.type, e.frame) for e in events] == [
        ("enter", 1), ("loiter", 5), ("exit", 11), ("enter", 13), ("loiter", 17)]
    loiter = events[1]
    assert (loiter.start, loiter.t_start, loiter.dwell_s, loiter.end) == (
        wall(1), clock(1), 1.0, None)
    assert events[2].dwell_s == pytest.approx(clock(11) - clock(1))
    assert scene.counts()["zones"]["z"]["loiter"] == 2


def test_a_track_that_ends_inside_exits_at_its_last_sighting() -> None:
    scene = zone_scene()
    run(scene, [OUT, IN, IN, IN, None, None])
    events = feed(scene, 6, [], ended=[1, 99])
    assert len(events) == 1
    leave = events[0]
    assert (leave.type, leave.frame, leave.clock) == ("exit", 6, clock(6))
    assert (leave.start, leave.end) == (wall(1), wall(3))
    assert leave.dwell_s == pytest.approx(clock(3) - clock(1))
    assert leave.score == pytest.approx(0.503)
    assert scene.counts()["zones"]["z"]["occupancy"] == 0
    # The id's row is reused: a new track with the same id starts outside.
    assert feed(scene, 7, [(1, *OUT)]) == []


def test_an_occluded_object_keeps_its_state() -> None:
    scene = zone_scene(min_frames=3)
    events = run(scene, [IN, None, IN, None, None, IN, None, None, None, IN])
    assert [(e.type, e.frame, e.start) for e in events] == [("enter", 5, wall(0))]
    assert scene.counts()["zones"]["z"]["occupancy"] == 1


@pytest.mark.parametrize("min_frames", [1, 3])
def test_an_object_first_seen_inside_enters_from_its_first_frame(min_frames: int) -> None:
    scene = zone_scene(min_frames=min_frames)
    events = run(scene, [IN] * 5 + [OUT] * 3)
    assert [(e.type, e.frame) for e in events] == [("enter", min_frames - 1),
                                                   ("exit", 5 + min_frames - 1)]
    enter, leave = events
    assert (enter.start, enter.t_start) == (wall(0), clock(0))
    assert (leave.start, leave.end) == (wall(0), wall(5))
    assert leave.dwell_s == pytest.approx(clock(5) - clock(0))


def test_a_track_ending_while_seen_outside_exits_when_it_was_first_seen_outside() -> None:
    # Entered at frame 1; outside from frame 5 but the track ends before the debounce decides.
    scene = zone_scene(min_frames=3)
    run(scene, [OUT, IN, IN, IN, IN, OUT, None, OUT])
    events = feed(scene, 8, [], ended=[1])
    assert [(e.type, e.frame, e.start, e.end) for e in events] == [("exit", 8, wall(1), wall(5))]
    assert events[0].dwell_s == pytest.approx(clock(5) - clock(1))


def test_no_loiter_while_seen_outside_before_the_exit_is_decided() -> None:
    # loiter_s is reached at frame 4, when the object has been outside since frame 3.
    scene = zone_scene(min_frames=3, loiter_s=1.0)
    events = run(scene, [IN, IN, IN, OUT, OUT, OUT, OUT])
    assert [(e.type, e.frame) for e in events] == [("enter", 2), ("exit", 5)]
    assert events[1].dwell_s == pytest.approx(clock(3) - clock(0))  # 0.75 s, under loiter_s
    assert scene.counts()["zones"]["z"]["loiter"] == 0


def test_jitter_out_of_the_zone_delays_loiter_to_the_next_frame_inside() -> None:
    scene = zone_scene(min_frames=3, loiter_s=1.0)
    events = run(scene, [IN, IN, IN, IN, OUT, IN, IN])
    assert [(e.type, e.frame, e.dwell_s) for e in events] == [
        ("enter", 2, None), ("loiter", 5, clock(5) - clock(0))]


def test_start_of_a_track_confirmed_inside_is_its_first_frame_with_an_id() -> None:
    """The tracker's tentative frames (id -1 until min_hits) are not seen by the scene."""
    tracker = ByteTracker(TrackConfig(min_hits=3))
    tracker.update(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))  # not the first frame
    scene = zone_scene()
    events: list[SceneEvent] = []
    firsts: list[int] = []
    for f in range(5):
        boxes = np.array([[190.0 + f, 160.0, 210.0 + f, 200.0]])
        update = tracker.update(boxes, np.array([0.9]), np.array([0]))
        firsts += [f] if update.ids[0] >= 0 and not firsts else []
        events += scene.update(clock(f), wall(f), f, update.ids, boxes, np.array([0]),
                               np.array([0.9]), ["person"], update.ended)
    assert firsts == [2]
    assert [(e.type, e.frame, e.start) for e in events] == [("enter", 2, wall(2))]


def line_scene(points: list[list[float]], directions: list[str] | None = None) -> Scene:
    extra = {} if directions is None else {"directions": directions}
    scene = Scene([], [LineConfig(name="l", points=points, coordinates="pixels", **extra)],
                  class_names=LABELS)
    scene.bind(640, 480)
    return scene


def test_horizontal_line_both_directions() -> None:
    # Drawn left to right: moving down the image is "in".
    scene = line_scene([[100, 240], [500, 240]], directions=["in"])
    events = run(scene, [(300, 200), (300, 280), (300, 300), (310, 200)])
    assert [(e.type, e.direction, e.frame) for e in events] == [("cross", "in", 1)]
    assert (events[0].start, events[0].t_start, events[0].line, events[0].zone) == (
        wall(1), clock(1), "l", None)
    assert scene.counts()["lines"]["l"] == {"in": 1, "out": 1}


def test_diagonal_line_both_directions() -> None:
    # Drawn from top left to bottom right: its right side is the lower left.
    scene = line_scene([[100, 100], [400, 400]])
    events = run(scene, [(300, 100), (100, 300), (120, 320), (330, 170)])
    assert [(e.direction, e.frame) for e in events] == [("in", 1), ("out", 3)]


@pytest.mark.parametrize("path", [
    [(600, 200), (600, 280)],             # beside the right end
    [(50, 200), (50, 280)],               # beside the left end
    [(480, 200), (560, 260)],             # a slanted path meeting the extension at x=540
])
def test_a_path_beside_the_end_does_not_count(path: list[tuple[float, float]]) -> None:
    scene = line_scene([[100, 240], [500, 240]])
    assert run(scene, path) == []
    assert scene.counts()["lines"]["l"] == {"in": 0, "out": 0}


def test_diagonal_path_beside_the_end_does_not_count() -> None:
    scene = line_scene([[100, 100], [400, 400]])
    assert run(scene, [(500, 400), (400, 500)]) == []  # meets the line's extension at (450, 450)


def test_jitter_on_the_line_counts_once() -> None:
    scene = line_scene([[100, 240], [500, 240]])
    path = [(300, 230), (300, 240), (301, 230), (302, 240), (303, 240), (304, 250), (305, 240),
            (306, 250), (306, 240), (306, 240)]
    events = run(scene, path)
    assert [(e.direction, e.frame) for e in events] == [("in", 5)]
    assert scene.counts()["lines"]["l"] == {"in": 1, "out": 0}


def test_leaving_the_line_beyond_its_end_does_not_count() -> None:
    # On the line's extension, then off it on the other side: the crossing was not on the line.
    scene = line_scene([[100, 240], [500, 240]])
    assert run(scene, [(550, 230), (550, 240), (450, 250)]) == []


@pytest.mark.parametrize(("classes", "names"), [(["person"], LABELS), ([0], LABELS),
                                                (["person"], None), ([0], None)])
def test_class_filter(classes: list[str | int], names: list[str] | None) -> None:
    scene = Scene([ZoneConfig(name="z", points=SQUARE, coordinates="pixels", classes=classes)],
                  [LineConfig(name="l", points=[[100, 240], [500, 240]], coordinates="pixels",
                              classes=classes)], class_names=names)
    scene.bind(640, 480)
    events: list[SceneEvent] = []
    for frame, y in enumerate([220, 260]):
        events += feed(scene, frame, [(1, 200, y, 0), (2, 250, y, 1)])
    assert [(e.type, e.track_id, e.label) for e in events] == [
        ("enter", 1, "person"), ("cross", 1, "person")]
    assert scene.counts() == {"zones": {"z": {"occupancy": 1, "entered": 1, "exited": 0,
                                              "loiter": 0}},
                              "lines": {"l": {"in": 1, "out": 0}}}


def test_unknown_class_names_the_path() -> None:
    zone = ZoneConfig(name="z", points=SQUARE, coordinates="pixels", classes=["person", "dog"])
    with pytest.raises(ConfigError) as info:
        Scene([zone], [], class_names=LABELS, where="$.pipelines[2]")
    assert str(info.value) == ("$.pipelines[2].zones[0].classes[1]: unknown class 'dog'; "
                               "the model's labels: person, car")
    line = LineConfig(name="l", points=[[0, 0], [1, 1]], classes=[0, 30])
    many = [f"c{i}" for i in range(30)]
    with pytest.raises(ConfigError) as info:
        Scene([], [line], class_names=many)
    assert str(info.value).startswith("$.pipelines[0].lines[0].classes[1]: unknown class 30; "
                                      "the model's labels: c0, c1, ")
    assert str(info.value).endswith("c19, ...")


def test_pixel_point_outside_the_frame_names_the_path() -> None:
    zone = ZoneConfig(name="z", points=[[10, 10], [100, 10], [700, 10], [10, 100]],
                      coordinates="pixels")
    scene = Scene([zone], [], class_names=None, where="$.pipelines[1]")
    with pytest.raises(ConfigError) as info:
        scene.bind(640, 480)
    assert str(info.value) == ("$.pipelines[1].zones[0].points: point 2 (700, 10) is outside "
                               "the 640x480 frame")
    scene.bind(800, 600)


def test_geometry_in_pixels_and_event_dict() -> None:
    scene = Scene([ZoneConfig(name="z", points=[[0, 0], [0.5, 0], [0.5, 0.5]])],
                  [LineConfig(name="l", points=[[0, 0.5], [1, 0.5]])], class_names=LABELS)
    with pytest.raises(StateError):
        feed(scene, 0, [])
    scene.bind(640, 480)
    geo = scene.geometry()
    assert [(n, k) for n, k, _ in geo] == [("z", "zone"), ("l", "line")]
    assert geo[0][2].tolist() == [[0, 0], [320, 0], [320, 240]]
    assert geo[1][2].dtype == np.int32 and geo[1][2].tolist() == [[0, 240], [640, 240]]
    events = run(scene, [(300, 200), (300, 300)])
    assert [e.type for e in events] == ["enter", "exit", "cross"]
    d = events[2].to_dict()
    assert "clock" not in d and d["t"] == 0.25 and d["t_start"] == 0.25
    assert d["end"] is None and d["zone"] is None and d["direction"] == "in"
    assert json.loads(json.dumps(d)) == d


def test_update_cost_50_tracks_3_zones_2_lines() -> None:
    """Micro-measurement (run with -s); asserts behaviour only, not time."""
    rng = np.random.default_rng(1)
    octagon = [[0.5 + 0.2 * np.cos(a), 0.5 + 0.2 * np.sin(a)]
               for a in np.linspace(0, 2 * np.pi, 8, endpoint=False)]
    zones = [ZoneConfig(name=f"z{k}", points=[[x + 0.1 * (k - 1), y] for x, y in octagon],
                        min_frames=2, loiter_s=5.0) for k in range(3)]
    lines = [LineConfig(name="h", points=[[0.1, 0.5], [0.9, 0.5]]),
             LineConfig(name="d", points=[[0.1, 0.1], [0.9, 0.9]])]
    scene = Scene(zones, lines, class_names=LABELS)
    scene.bind(640, 480)
    n, frames = 50, 2000
    pos = rng.uniform([0, 0], [640, 480], size=(n, 2))
    vel = rng.normal(0, 4, size=(n, 2))
    ids = np.arange(n, dtype=np.int64)
    classes = np.zeros(n, dtype=np.int64)
    scores = np.full(n, 0.8, dtype=np.float32)
    labels = ["person"] * n
    total = 0
    elapsed = 0.0
    for f in range(frames):
        pos = np.clip(pos + vel, 0, [640, 480])
        boxes = np.column_stack([pos[:, 0] - 10, pos[:, 1] - 40, pos[:, 0] + 10, pos[:, 1]])
        t0 = time.perf_counter()
        total += len(scene.update(f / 30, 1e9 + f / 30, f, ids, boxes, classes, scores, labels,
                                  ()))
        elapsed += time.perf_counter() - t0
    print(f"\nScene.update: {elapsed / frames * 1e3:.3f} ms/frame (50 tracks, 3 zones, 2 lines,"
          f" {total} events in {frames} frames)")
    counts = scene.counts()
    assert total > 0
    assert all(0 <= z["occupancy"] <= n for z in counts["zones"].values())


def test_many_tracks_grow_the_state_and_end_cleanly() -> None:
    scene = zone_scene()
    objs = [(tid, 110.0 + tid, 200.0) for tid in range(150)]
    assert len(feed(scene, 0, objs)) == 150
    assert scene.counts()["zones"]["z"]["occupancy"] == 150
    events = feed(scene, 1, objs[:10], ended=[tid for tid, _, _ in objs[10:]])
    assert [e.type for e in events] == ["exit"] * 140
    assert {e.end for e in events} == {wall(0)}
    assert scene.counts()["zones"]["z"] == {"occupancy": 10, "entered": 150, "exited": 140,
                                            "loiter": 0}


def test_a_track_confirmed_past_a_line_after_frames_without_detections_counts_its_crossing(
        ) -> None:
    """Motion gating: a fast object is first detected left of the line, the model skips two
    frames, and the detection that confirms its track is right of it. The tracker says where
    the track was first seen (`TrackUpdate.earlier`) and the line counts the crossing."""
    scene = line_scene([[320, 0], [320, 480]])
    tracker = ByteTracker(TrackConfig())
    tracker.update(np.empty((0, 4)), np.empty(0), np.empty(0, dtype=np.int64))
    events: list[SceneEvent] = []
    for f, x in ((1, 200), (4, 380), (7, 560)):  # 180 px a detection: boxes 80 px wide
        box = np.array([[x - 40, 200, x + 40, 280]], dtype=float)
        update = tracker.update(box, np.array([0.9]), np.array([0]))
        if update.earlier is not None:
            scene.seed(update.ids[:1], update.earlier[:1])
        events += scene.update(clock(f), wall(f), f, update.ids, box, np.array([0]),
                               np.array([0.9]), ["person"], update.ended)
        tracker.predict()
        tracker.predict()
    assert [(e.type, e.direction, e.frame, e.track_id) for e in events] == [
        ("cross", "out", 4, 1)]
    # Tracked on every frame, a track is seen from the frame it is confirmed, as before.
    every = ByteTracker(TrackConfig())
    every.update(np.empty((0, 4)), np.empty(0), np.empty(0, dtype=np.int64))
    for x in (300, 310):
        update = every.update(np.array([[x - 40, 200, x + 40, 280]], dtype=float),
                              np.array([0.9]), np.array([0]))
    assert update.ids.tolist() == [1] and update.earlier is None
