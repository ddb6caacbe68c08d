"""ByteTracker between detections (a motion-gated pipeline): `predict` moves tracks along
without aging them, and a track that stops becomes stationary (kept, not aged by detection
frames that miss it, woken by motion)."""

from __future__ import annotations

import numpy as np

from edgeinfer.analytics.tracker import ByteTracker
from edgeinfer.config.analytics import TrackConfig


def _box(cx: float, cy: float, w: float = 40.0, h: float = 80.0) -> list[float]:
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def _update(tracker: ByteTracker, boxes: list[list[float]], *, recheck: bool = True,
            score: float = 0.9) -> np.ndarray:
    n = len(boxes)
    update = tracker.update(np.array(boxes, dtype=float).reshape(n, 4), np.full(n, score),
                            np.zeros(n, dtype=np.int64), recheck=recheck)
    return update.ids


def test_predict_follows_a_moving_object_between_detections_and_is_no_miss() -> None:
    tracker = ByteTracker(TrackConfig(max_lost=2))
    # Detections every 3rd frame of an object moving 6 px a frame; predictions in between.
    for f in range(60):
        truth = _box(100 + 6 * f, 200)
        if f % 3 == 0:
            ids = _update(tracker, [truth])
            assert ids.tolist() == [1]
            continue
        predicted = tracker.predict()
        assert predicted.ids.tolist() == [1], f  # never lost: predictions are no misses
        assert predicted.scores.tolist() == [0.9] and predicted.classes.tolist() == [0]
        if f > 12:  # once the velocity is learnt the prediction is on the object
            assert abs(predicted.boxes[0][0] - truth[0]) < 3, (f, predicted.boxes, truth)
    assert tracker.active == 1 and tracker.stationary == 0


def test_predict_with_no_tracks_is_empty() -> None:
    predicted = ByteTracker(TrackConfig()).predict()
    assert predicted.ids.shape == (0,) and predicted.boxes.shape == (0, 4)


def test_a_still_track_becomes_stationary_and_misses_only_count_on_rechecks() -> None:
    tracker = ByteTracker(TrackConfig(max_lost=3), stationary_after=4)
    for f in range(5):
        _update(tracker, [_box(100 + 10 * f, 200)])
    for _ in range(3):  # it stopped at 140: three more detections there
        _update(tracker, [_box(140, 200)])
        assert tracker.stationary == 0
    _update(tracker, [_box(140.5, 200)])  # the fourth: jitter is not movement
    assert tracker.stationary == 1
    # Detection frames run for motion elsewhere (or a crop without it): no misses, id kept.
    for _ in range(10):
        _update(tracker, [_box(500, 300)], recheck=False)
        predicted = tracker.predict()
        assert 1 in predicted.ids.tolist()
    i = predicted.ids.tolist().index(1)
    assert np.allclose(predicted.boxes[i], _box(140, 200), atol=1.5)  # velocity zeroed
    assert tracker.active == 2
    # Re-checks of the whole frame that miss it age it: it ends after max_lost of them.
    ended: tuple[int, ...] = ()
    for _ in range(4):
        n = 1
        ended += tracker.update(np.array([_box(500, 300)]), np.full(n, 0.9),
                                np.zeros(n, dtype=np.int64), recheck=True).ended
    assert ended == (1,)


def test_motion_over_a_stationary_track_makes_it_moving_again() -> None:
    tracker = ByteTracker(TrackConfig(max_lost=2), stationary_after=2)
    for _ in range(4):
        _update(tracker, [_box(100, 100)])
    assert tracker.stationary == 1
    moving, still = tracker.live_boxes()
    assert moving.shape == (0, 4) and still.shape == (1, 4)
    assert tracker.touch(np.array([[300.0, 300.0, 350.0, 350.0]])) == 0  # elsewhere
    assert tracker.stationary == 1
    assert tracker.touch(np.array([[110.0, 120.0, 150.0, 150.0]])) == 1  # over it
    assert tracker.stationary == 0
    # Moving again: a detection frame that misses it is a miss.
    for _ in range(3):
        _update(tracker, [], recheck=False)
    assert tracker.active == 0


def test_a_slow_drift_is_movement() -> None:
    tracker = ByteTracker(TrackConfig(), stationary_after=5)
    for f in range(40):  # 2 px per detection: each small, but the box leaves where it stopped
        _update(tracker, [_box(100 + 2 * f, 200)])
    assert tracker.stationary == 0


def test_a_track_missed_by_a_few_detections_stops_holding_the_gate_open() -> None:
    """A moving track keeps a motion gate's model running at detect.fps; once detections have
    missed it a few times (the object left) it no longer does, though it lives until
    max_lost."""
    tracker = ByteTracker(TrackConfig(max_lost=30))
    for f in range(6):
        _update(tracker, [_box(100 + 10 * f, 200)])
    assert len(tracker.live_boxes()[0]) == 1
    misses = 0
    while len(tracker.live_boxes()[0]):
        _update(tracker, [])
        misses += 1
        assert misses <= 3, "a lost track held the gate open"
    assert tracker.active == 1  # still alive (lost), ends only after max_lost misses


def _gated_run(tracker: ByteTracker, paths: list[list[float] | None], frames: int, *,
               every: int = 3, jitter: float = 2.0, seed: int = 5
               ) -> tuple[dict[int, list[int]], list[int]]:
    """Objects on ``paths`` (per object ``[x0, y0, vx, vy, w, h, first_frame]``, ``None``
    skipped) detected every ``every``-th frame with jittered boxes, predicted in between:
    per object the track id at each of its detections (-1: none), and the frames predicted
    with a track on each object (a box over it)."""
    rng = np.random.default_rng(seed)
    ids: dict[int, list[int]] = {k: [] for k in range(len(paths))}
    followed = [0] * len(paths)
    tracker.update(np.empty((0, 4)), np.empty(0), np.empty(0, dtype=np.int64))  # the start
    for f in range(1, frames):
        truth = {k: _box(p[0] + p[2] * (f - p[6]), p[1] + p[3] * (f - p[6]), p[4], p[5])
                 for k, p in enumerate(paths) if p is not None and f >= p[6]}
        if f % every:
            predicted = tracker.predict()
            for k, box in truth.items():
                followed[k] += any(_overlap(box, b) > 0.3 for b in predicted.boxes)
            continue
        keys = list(truth)
        boxes = np.array([truth[k] for k in keys]).reshape(-1, 4)
        boxes += rng.normal(0, jitter, boxes.shape)
        got = tracker.update(boxes, np.full(len(keys), 0.8), np.zeros(len(keys), dtype=np.int64),
                             recheck=False).ids
        for k, tid in zip(keys, got.tolist()):
            ids[k].append(tid)
    return ids, followed


def _overlap(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_an_object_moving_two_widths_between_detections_is_confirmed_and_followed() -> None:
    """Detections 3 frames apart (detect.fps 5 of a 15 fps camera) of an 85 px face moving
    1.1 to 2 widths between them: the boxes never overlap, yet the track is confirmed at its
    second detection and keeps one id; in between, its predicted box is on the face."""
    for widths in (1.1, 1.5, 2.0):
        speed = widths * 85 / 3  # px per frame
        tracker = ByteTracker(TrackConfig(max_lost=10), stationary_after=10)
        ids, followed = _gated_run(tracker, [[20, 300, speed, 0, 85, 85, 4]],
                                   4 + int(1200 / speed))
        seen = ids[0]
        assert len(seen) >= 4, seen
        assert seen[0] == -1 and seen[1] > 0, (widths, seen)  # confirmed at the second
        assert set(seen[1:]) == {seen[1]}, (widths, seen)
        # Predicted frames after the second detection follow it (two per interval).
        assert followed[0] >= 2 * (len(seen) - 2), (widths, followed, seen)


def test_fast_objects_crossing_each_other_keep_their_ids() -> None:
    """Two 85 px objects 2 widths apart per detection interval, in opposite directions on
    rows a third of a box apart, pass each other between two detections: no id switch. A
    third appears far from both: it is not taken for either."""
    speed = 1.8 * 85 / 3
    paths: list[list[float] | None] = [[40, 300, speed, 0, 85, 85, 1],
                                       [1240, 330, -speed, 0, 85, 85, 1],
                                       [640, 650, 0, -speed, 85, 85, 10]]
    for seed in range(5):
        tracker = ByteTracker(TrackConfig(max_lost=10))
        ids, _ = _gated_run(tracker, paths, 42, seed=seed)
        owned = [{t for t in ids[k][1:] if t > 0} for k in range(3)]
        assert [len(o) for o in owned] == [1, 1, 1], (seed, ids)
        assert len(set.union(*owned)) == 3, (seed, ids)
        assert all(t > 0 for k in range(3) for t in ids[k][1:]), (seed, ids)


def test_a_new_fast_object_missed_once_is_confirmed_by_its_next_detection() -> None:
    """First detection, a detection frame that misses it (occluded, a low score), then found
    2 x 1.5 widths further on: one object, confirmed there with its velocity; a low-score
    detection then continues it."""
    tracker = ByteTracker(TrackConfig())
    tracker.update(np.empty((0, 4)), np.empty(0), np.empty(0, dtype=np.int64))
    seen = []
    for f in range(3, 16, 3):
        x = 100 + 40 * (f - 3)  # 120 px (1.5 widths of 80) per detection interval
        boxes = [] if f == 6 else [_box(x, 300, 80, 80)]
        seen.append(_update(tracker, boxes, score=0.3 if f == 15 else 0.9).tolist())
        for _ in range(2):
            tracker.predict()
    assert seen == [[-1], [], [1], [1], [1]], seen
    assert abs(tracker.predict().boxes[0][0] - (100 + 40 * 15 - 40)) < 15
