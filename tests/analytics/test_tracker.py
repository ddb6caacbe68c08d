"""ByteTracker: ids stay on objects that move, cross, hide; low scores continue, never start."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.analytics.tracker import ByteTracker, TrackUpdate
from edgeinfer.config.analytics import TrackConfig
from edgeinfer.errors import InvalidInputError


def _box(cx: float, cy: float, w: float = 40.0, h: float = 80.0) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def _frame(tracker: ByteTracker, boxes: list[list[float]], scores: list[float] | None = None,
           classes: list[int] | None = None) -> TrackUpdate:
    n = len(boxes)
    return tracker.update(np.array(boxes, dtype=float).reshape(n, 4),
                          np.array(scores if scores is not None else [0.9] * n),
                          np.array(classes if classes is not None else [0] * n))


def test_straight_lines_and_crossing_keep_their_ids() -> None:
    tracker = ByteTracker(TrackConfig())
    seen: list[set[int]] = [set(), set(), set()]
    crossed_overlap = 0
    rng = np.random.default_rng(3)
    for f in range(80):
        # 0 goes right, 1 goes left on nearly the same row (they overlap around f = 40),
        # 2 goes down far away.
        boxes = [_box(100 + 5 * f, 200), _box(500 - 5 * f, 210), _box(700, 50 + 4 * f)]
        jitter = rng.normal(0, 1.0, (3, 4))
        a, b = np.array(boxes[0]), np.array(boxes[1])
        if min(a[2], b[2]) > max(a[0], b[0]):
            crossed_overlap += 1
        update = _frame(tracker, (np.array(boxes) + jitter).tolist())
        for obj, tid in enumerate(update.ids):
            if f >= 1:
                assert tid > 0, f"object {obj} has no id at frame {f}"
                seen[obj].add(int(tid))
        assert update.ended == ()
    assert crossed_overlap >= 5  # the boxes really overlapped for several frames
    assert [len(s) for s in seen] == [1, 1, 1], seen
    assert len(set.union(*seen)) == 3
    assert tracker.active == 3


@pytest.mark.parametrize("hidden", [1, 5, 10])
def test_object_hidden_up_to_max_lost_keeps_its_id(hidden: int) -> None:
    tracker = ByteTracker(TrackConfig(max_lost=10))
    ids = []
    for f in range(40 + hidden):
        if 20 <= f < 20 + hidden:
            update = _frame(tracker, [])
            assert update.ended == ()
            assert tracker.active == 1
            continue
        ids.append(int(_frame(tracker, [_box(100 + 3 * f, 300)]).ids[0]))
    assert set(ids) == {1}  # born in the stream's first frame: confirmed at once


def test_object_hidden_longer_than_max_lost_gets_a_new_id_and_the_old_one_ends_once() -> None:
    tracker = ByteTracker(TrackConfig(max_lost=10))
    ended: list[int] = []
    ids = []
    for f in range(50):
        boxes = [] if 20 <= f < 31 else [_box(100 + 3 * f, 300)]
        update = _frame(tracker, boxes)
        ended.extend(update.ended)
        ids.extend(int(i) for i in update.ids)
        if f == 30:
            assert update.ended == (1,)  # the 11th missed frame
            assert tracker.active == 0
    assert ended == [1]
    assert set(ids[1:20]) == {1}
    assert ids[20] == -1  # the new track is tentative again
    assert set(ids[21:]) == {2}


def test_low_score_detections_continue_a_track_but_never_start_one() -> None:
    tracker = ByteTracker(TrackConfig())
    for _ in range(20):
        # a steady low-score object never gets a track
        assert _frame(tracker, [_box(600, 300)], scores=[0.3]).ids.tolist() == [-1]
        assert tracker.active == 0
    tracker.reset()
    ids = []
    for f in range(30):
        score = 0.9 if f < 5 else 0.3  # confirmed, then the detector grows unsure
        ids.append(int(_frame(tracker, [_box(100 + 4 * f, 300)], scores=[score]).ids[0]))
    assert len(set(ids)) == 1 and ids[0] > 0  # the first frame after reset confirms at once
    # below low_threshold a detection is ignored and the track goes lost
    assert _frame(tracker, [_box(220, 300)], scores=[0.05]).ids.tolist() == [-1]


def test_low_score_detection_does_not_revive_a_lost_track() -> None:
    tracker = ByteTracker(TrackConfig())
    for f in range(5):
        _frame(tracker, [_box(100 + 4 * f, 300)])
    _frame(tracker, [])  # now lost
    assert _frame(tracker, [_box(124, 300)], scores=[0.3]).ids.tolist() == [-1]
    assert _frame(tracker, [_box(128, 300)], scores=[0.9]).ids.tolist() == [1]


def test_per_class_keeps_classes_apart() -> None:
    tracker = ByteTracker(TrackConfig(per_class=True))
    for f in range(10):
        update = _frame(tracker, [_box(100 + 2 * f, 300), _box(101 + 2 * f, 301)],
                        classes=[0, 1])
    assert sorted(update.ids.tolist()) == [1, 2]
    # a class-1 detection where the class-0 track is does not continue it
    assert _frame(tracker, [_box(122, 300)], classes=[1]).ids.tolist() == [2]
    mixed = ByteTracker(TrackConfig(per_class=False))
    for f in range(10):
        _frame(mixed, [_box(100 + 2 * f, 300)], classes=[0])
    assert _frame(mixed, [_box(120, 300)], classes=[3]).ids.tolist() == [1]


def test_tentative_tracks_get_no_id_until_min_hits() -> None:
    tracker = ByteTracker(TrackConfig(min_hits=3))
    _frame(tracker, [])  # past the stream's first frame, which confirms at once
    ids = [int(_frame(tracker, [_box(100 + 2 * f, 300)]).ids[0]) for f in range(5)]
    assert ids == [-1, -1, 1, 1, 1]
    # an unmatched tentative track is dropped: the flicker never gets an id
    flicker = [int(_frame(tracker, [_box(110 + 2 * f, 300), _box(900, 500)] if f % 2 == 0
                          else [_box(110 + 2 * f, 300)]).ids[-1]) for f in range(6)]
    assert set(flicker[::2]) == {-1}
    assert tracker.active == 1
    assert ByteTracker(TrackConfig(min_hits=1)).update(
        np.array([_box(5, 5)]), np.array([0.9]), np.array([0])).ids.tolist() == [1]


def test_empty_frames() -> None:
    tracker = ByteTracker(TrackConfig())
    for empty in (np.empty((0, 4)), np.empty(0), np.zeros((0, 4), dtype=np.float32)):
        update = tracker.update(empty, np.empty(0), np.empty(0, dtype=np.int64))
        assert update.ids.dtype == np.int64 and update.ids.shape == (0,)
        assert update.ended == ()
    assert tracker.active == 0


@pytest.mark.parametrize(("boxes", "scores", "classes", "message"), [
    (np.zeros((2, 5)), np.zeros(2), np.zeros(2, int), "boxes must have shape (N, 4)"),
    (np.zeros(4), np.zeros(1), np.zeros(1, int), "boxes must have shape (N, 4)"),
    (np.zeros((2, 4)), np.zeros(3), np.zeros(2, int), "must have shape (N,) for 2 boxes"),
    (np.zeros((2, 4)), np.zeros(2), np.zeros((2, 1), int), "must have shape (N,) for 2 boxes"),
    (np.zeros((1, 4)), np.zeros(1), np.array([0.5]), "classes must be integer class ids"),
])
def test_wrong_shapes_are_refused(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                                  message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ByteTracker(TrackConfig()).update(boxes, scores, classes)
    assert issubclass(InvalidInputError, ValueError)


def test_nan_and_empty_boxes_are_ignored() -> None:
    tracker = ByteTracker(TrackConfig())
    bad = [[np.nan, 0, 10, 10], [0, 0, np.inf, 10], [50, 50, 50, 90], [60, 60, 70, 70]]
    for f in range(5):
        update = _frame(tracker, [_box(100 + 2 * f, 300), *bad],
                        scores=[0.9, 0.9, 0.9, 0.9, float("nan")])
        assert update.ids[1:].tolist() == [-1, -1, -1, -1]
    assert update.ids[0] == 1
    assert tracker.active == 1


def test_ids_stay_unique_across_reset() -> None:
    tracker = ByteTracker(TrackConfig())
    first = set()
    for f in range(5):
        first.update(_frame(tracker, [_box(100, 100 + f), _box(300, 100 + f)]).ids.tolist())
    tracker.reset()
    assert tracker.active == 0
    second = set()
    for f in range(5):
        second.update(_frame(tracker, [_box(100, 100 + f), _box(300, 100 + f)]).ids.tolist())
    first.discard(-1)
    second.discard(-1)
    assert first == {1, 2} and second == {3, 4}


def test_many_crossing_objects_in_a_crowd_keep_ids() -> None:
    """A seeded crowd of 30 objects on straight lines with jitter: few id switches."""
    rng = np.random.default_rng(7)
    n, frames = 30, 120
    start = rng.uniform(100, 1500, (n, 2))
    vel = rng.uniform(-4, 4, (n, 2))
    size = rng.uniform(30, 60, (n, 1)) * np.array([[1.0, 2.0]])
    tracker = ByteTracker(TrackConfig())
    owner: dict[int, set[int]] = {}
    for f in range(frames):
        centre = start + vel * f
        boxes = np.hstack([centre - size / 2, centre + size / 2]) + rng.normal(0, 1, (n, 4))
        update = tracker.update(boxes, rng.uniform(0.6, 1.0, n), np.zeros(n, int))
        for obj, tid in enumerate(update.ids.tolist()):
            if tid > 0:
                owner.setdefault(obj, set()).add(tid)
    switches = sum(len(ids) - 1 for ids in owner.values())
    assert len(owner) == n
    assert switches <= 2, owner


def test_tracks_of_the_first_frame_are_confirmed_at_once_later_ones_wait() -> None:
    tracker = ByteTracker(TrackConfig(min_hits=2))
    assert _frame(tracker, [_box(100, 300), _box(300, 300)]).ids.tolist() == [1, 2]
    assert _frame(tracker, [_box(100, 300), _box(300, 300), _box(600, 300)]).ids.tolist() == [
        1, 2, -1]
    assert _frame(tracker, [_box(100, 300), _box(300, 300), _box(600, 300)]).ids.tolist() == [
        1, 2, 3]
    tracker.reset()
    assert _frame(tracker, [_box(100, 300)]).ids.tolist() == [4]


def test_boxes_are_the_tracks_smoothed_boxes_for_tracked_detections_only() -> None:
    rng = np.random.default_rng(11)
    tracker = ByteTracker(TrackConfig())
    raw_err, kf_err = [], []
    for f in range(60):
        true = np.array([_box(100 + 3 * f, 300), _box(900, 500)])
        noisy = true + rng.normal(0, 3.0, (2, 4))
        # a low-score detection far from any track gets no id
        boxes = np.vstack([noisy, _box(1500, 100)])
        update = _frame(tracker, boxes.tolist(), scores=[0.9, 0.9, 0.3])
        assert update.boxes.shape == (3, 4) and update.boxes.dtype == np.float64
        assert update.ids[2] == -1
        assert update.boxes[2].tolist() == boxes[2].tolist()
        assert (update.ids[:2] > 0).all()
        if f >= 10:
            raw_err.append(np.abs(noisy - true).mean())
            kf_err.append(np.abs(update.boxes[:2] - true).mean())
    assert np.mean(kf_err) < 0.8 * np.mean(raw_err), (np.mean(kf_err), np.mean(raw_err))


def test_an_unmatched_track_does_not_make_its_neighbour_take_a_newcomer() -> None:
    """A's detection stays A's when B is missed and a new object overlaps A: the assignment
    does not trade one good pair for two poor ones to match more tracks."""
    tracker = ByteTracker(TrackConfig())
    a, b = _box(100, 300), _box(124, 300)  # IoU(a, b) = 0.25
    for _ in range(10):
        ids = _frame(tracker, [a, b]).ids.tolist()
    assert ids == [1, 2]
    newcomer = _box(84, 300)  # IoU 0.43 with a, 0 with b
    assert _frame(tracker, [a, newcomer]).ids.tolist() == [1, -1]
    assert _frame(tracker, [a, b]).ids.tolist() == [1, 2]


def test_a_track_seen_last_frame_wins_over_a_long_lost_one_when_overlaps_are_close() -> None:
    tracker = ByteTracker(TrackConfig())
    seen, lost = _box(100, 300), _box(104, 300)
    for _ in range(10):
        ids = _frame(tracker, [seen, lost]).ids.tolist()
    assert ids == [1, 2]
    for _ in range(10):
        assert _frame(tracker, [seen]).ids.tolist() == [1]
    # IoU 0.77 with the track seen last frame, 0.95 with the one lost for 10 frames
    assert _frame(tracker, [_box(103, 300)]).ids.tolist() == [1]
