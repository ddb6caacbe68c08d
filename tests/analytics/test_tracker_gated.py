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
