"""ByteTrack-style multi-object tracking of per-frame detections.

Each `ByteTracker.update` takes one frame's detections (boxes xyxy in pixels, scores, class
ids) and says which confirmed track each detection belongs to. Association follows ByteTrack
(Zhang et al., 2022): high-score detections are matched first against every live track by IoU
with the track's Kalman-predicted box times the detection's score, then low-score detections
against the tracks still unmatched that were seen in the previous frame (by IoU alone);
tentative (unconfirmed) tracks then get the high-score detections left over, and only
high-score detections start tracks. Tracks born in the stream's first frame are confirmed at
once, as in ByteTrack.

Two departures from the reference, both measured on motmetrics' TUD sequences
(``bench/tracker_quality.py``): a lost track's cost grows by ``_LOST_PENALTY`` per missed frame
(up to ``_LOST_PENALTY_FRAMES``), so a track seen in the last frame wins a detection that a
long-lost track, drifting on its old velocity, overlaps as well; and a pair that may not match
costs as much as leaving its track and detection unmatched, never a huge constant, so the
assignment never gives up one good pair to make two poor ones.

The constant-velocity Kalman filter on (cx, cy, aspect, height) uses ByteTrack's noise scheme
(scaled by the box height) and runs on all tracks at once: the state is a set of numpy arrays
(means ``T x 8``, covariances ``T x 8 x 8``), not one object per track.

Between detections (a motion-gated pipeline runs the model on some frames only), `predict`
advances every track by one frame and returns where the live ones are; it is no miss. A track
whose box has not moved for ``stationary_after`` of its detections is stationary: its velocity
is zeroed, detection frames that miss it do not age it (the model was run for motion elsewhere,
or on a crop without it) unless they are re-checks of the whole frame, and `touch` (motion
over it) makes it moving again.

Across a detection interval an object may move more than its own width (a face crossing a
720p frame at 600 px/s moves 1-2 widths between detections at 5 a second): its boxes at two
detections do not overlap, and a new track, whose velocity is still unknown, cannot be matched
by IoU at all. So a track that `predict` carried over frames without detections, and that IoU
left unmatched, is matched by distance next: a high-score detection whose centre lies within
``_REACH`` of the track's size (the geometric mean of width and height) per frame elapsed since
its last match, from its predicted centre, and whose size is within ``_SIZE_RATIO`` of its own;
the nearest (relative to that reach) wins in one assignment; then low-score detections, for
confirmed tracks only (ByteTrack's second association, by distance). A track whose velocity is
still unknown (one detection so far) takes it from its two detections (displacement over the
frames between them), so its next prediction is on the object. A tentative track carried so is
kept through one missed detection (a detector that misses a small, fast object once would
otherwise restart it at every detection and never confirm it), and its next match confirms it.
Every-frame tracking never sees any of this (no frame passes without detections): it is
ByteTrack's as before.
"""

# Over 450 lines: one tracker; its association stages share one Kalman state of numpy arrays.
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from edgeinfer.config.analytics import TrackConfig
from edgeinfer.errors import InvalidInputError

__all__ = ["ByteTracker", "TrackPrediction", "TrackUpdate"]

_W_POS = 1.0 / 20.0
_W_VEL = 1.0 / 160.0
_LOST_PENALTY = 0.02
_LOST_PENALTY_FRAMES = 10
_GATE_LOST = 2  # detections a moving track may miss and still keep a detection gate open
_NO_IDS = np.empty(0, dtype=np.int64)
_STILL_IOU = 0.8  # IoU with the box where it stopped, at or above which a track has not moved
_REACH = 1.0  # sizes per elapsed frame: how far from its prediction a detection may match a
# track by distance (across a detection interval; 3 sizes at detect.fps 5 of a 15 fps camera)
_TENTATIVE_LOST = 1  # detections a tentative track carried across frames may miss and live
_SIZE_RATIO = 2.0  # most width or height ratio between a track and a detection it matches


@dataclass(frozen=True, slots=True)
class TrackUpdate:
    """What one `ByteTracker.update` found.

    Attributes:
        ids: ``int64 (N,)``: the confirmed track id of each input detection, ``-1`` where the
            detection belongs to no confirmed track (unmatched, tentative, ignored).
        ended: Confirmed track ids that ended in this update (unmatched for more than
            ``max_lost`` frames); each id is reported once.
        boxes: ``float64 (N, 4)`` xyxy: for a detection with an id, its track's box after this
            frame's Kalman update (the detection smoothed by the track's motion, what ByteTrack
            reports); for the others, the detection's own box.
        earlier: ``float64 (N, 4)`` xyxy or ``None``: where a track that this update confirmed
            after frames without detections (motion gating) was at its first detection; NaN
            rows for the other detections; ``None`` when there is no such track. A fast object
            may cross a line between its first detection and the one that confirms it: lines
            take this as where the track was seen before (`Scene.seed`).
    """

    ids: np.ndarray
    ended: tuple[int, ...]
    boxes: np.ndarray
    earlier: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class TrackPrediction:
    """Where the live confirmed tracks are in a frame without detections (`ByteTracker.predict`).

    Attributes:
        ids: ``int64 (K,)`` track ids of the confirmed tracks matched at their last detection
            frame (lost ones are not reported, as in `update`).
        boxes: ``float64 (K, 4)`` xyxy: each track's Kalman-predicted box.
        classes: ``int64 (K,)``: each track's class.
        scores: ``float64 (K,)``: the score of each track's last matched detection.
    """

    ids: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    scores: np.ndarray


class ByteTracker:
    """Gives detections stable track ids across frames (ByteTrack's two-stage association).

    A track starts tentative from a high-score detection (``new_track_threshold``) and is
    confirmed after ``min_hits`` consecutive matched frames; only then does it get an id. Tracks
    born in the first `update` after construction or `reset` are confirmed at once: there is
    nothing yet to confuse them with, and objects in view at the start keep every frame. Ids are
    increasing integers from 1, never reused in a tracker's life, `reset` included. A confirmed
    track unmatched for more than ``max_lost`` frames ends; an unmatched tentative track is
    dropped at once (after frames without detections, at its second miss: see the module's
    notes on motion gating). Detections with a non-finite or empty box or a non-finite score are
    ignored (id ``-1``), not refused.

    Not thread-safe: one tracker follows one stream.

    Args:
        config: Thresholds and lifetimes (``track:`` of a pipeline).
        stationary_after: Detections of a track without moving (IoU with the box where it
            stopped of at least 0.8) after which it is stationary; ``None``: never.
    """

    def __init__(self, config: TrackConfig, stationary_after: int | None = None) -> None:
        self._cfg = config
        self._stationary_after = stationary_after
        self._next_id = 1
        self.reset()

    @property
    def active(self) -> int:
        """Confirmed tracks alive: matched in the last frame or lost but not yet ended."""
        return int(np.count_nonzero(self._tid > 0))

    def reset(self) -> None:
        """Forget every track (a new scene); the next ids continue the old count."""
        self._mean = np.empty((0, 8))
        self._cov = np.empty((0, 8, 8))
        self._tid = np.empty(0, dtype=np.int64)  # 0 while tentative
        self._cls = np.empty(0, dtype=np.int64)
        self._hits = np.empty(0, dtype=np.int64)
        self._lost = np.empty(0, dtype=np.int64)
        self._score = np.empty(0)
        self._anchor = np.empty((0, 4))  # the box where each track stopped moving
        self._still = np.empty(0, dtype=np.int64)  # its detections since, without moving
        self._stationary = np.empty(0, dtype=bool)
        self._since = np.empty(0, dtype=np.int64)  # frames since its last match
        self._skips = np.empty(0, dtype=np.int64)  # ... of which without detections (predict)
        self._fresh = np.empty(0, dtype=bool)  # matched once: no velocity yet
        self._origin = np.empty((0, 4))  # the box of its first detection
        self._first = True

    @property
    def stationary(self) -> int:
        """Tracks that are stationary now."""
        return int(np.count_nonzero(self._stationary))

    def predict(self) -> TrackPrediction:
        """Advance every track by one frame that has no detections and return the predicted
        boxes of the live confirmed tracks. Not a miss: tracks age only in `update`."""
        self._predict()
        self._skips += 1
        live = np.flatnonzero((self._tid > 0) & (self._lost == 0))
        return TrackPrediction(self._tid[live], _xyxy(self._mean[live]), self._cls[live],
                               self._score[live])

    def touch(self, boxes: np.ndarray) -> int:
        """Motion in ``boxes`` (``(M, 4)`` xyxy): stationary tracks whose box meets one of them
        are moving again (re-detected, and missed detections count). Returns how many."""
        still = np.flatnonzero(self._stationary)
        if not len(still) or not len(boxes):
            return 0
        mine = _xyxy(self._mean[still])
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        meets = ((mine[:, None, 0] < b[None, :, 2]) & (b[None, :, 0] < mine[:, None, 2])
                 & (mine[:, None, 1] < b[None, :, 3]) & (b[None, :, 1] < mine[:, None, 3]))
        woken = still[meets.any(axis=1)]
        self._stationary[woken] = False
        self._still[woken] = 0
        self._anchor[woken] = mine[meets.any(axis=1)]
        return len(woken)

    def live_boxes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(moving, stationary)`` xyxy boxes (``(K, 4)`` each) of the tracks a detection gate
        must keep an eye on: tentative ones and those missed by at most ``_GATE_LOST``
        detections among the moving. A track missed for longer (an object that left, or that
        the model no longer finds) does not keep the model running at ``detect.fps``: motion
        or the keep-alive finds it again, and it ages as before until ``max_lost``."""
        boxes = _xyxy(self._mean)
        moving = ~self._stationary & (self._lost <= _GATE_LOST)
        return boxes[moving], boxes[self._stationary]

    def update(self, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, *,
               recheck: bool = True) -> TrackUpdate:
        """Associate one frame's detections with the tracks.

        Args:
            boxes: ``(N, 4)`` float boxes ``x1, y1, x2, y2`` in pixels; ``N`` may be 0.
            scores: ``(N,)`` detection scores in 0..1.
            classes: ``(N,)`` integer class ids.
            recheck: The model looked at the whole frame to re-check it (not for motion
                elsewhere): stationary tracks it misses age too.

        Returns:
            The confirmed track id of each detection and the ids of tracks that ended.

        Raises:
            InvalidInputError: (a ``ValueError``) the arrays have wrong shapes or lengths.
        """
        boxes, scores, classes = _checked(boxes, scores, classes)
        n = len(scores)
        ids = np.full(n, -1, dtype=np.int64)
        out = boxes.copy()
        if len(self._tid) == 0 and n == 0:
            self._first = False
            return TrackUpdate(ids, (), out)
        cfg = self._cfg
        self._predict()
        valid = _usable(boxes, scores)
        high = np.flatnonzero(valid & (scores >= cfg.high_threshold))
        low = np.flatnonzero(valid & (scores >= cfg.low_threshold) & (scores < cfg.high_threshold))
        confirmed = self._tid > 0
        t1, d1 = self._associate(np.flatnonzero(confirmed), boxes, classes, high, cfg.match_iou,
                                 scores)
        free = np.ones(len(confirmed), dtype=bool)
        free[t1] = False
        second = np.flatnonzero(free & confirmed & (self._lost == 0))
        t2, d2 = self._associate(second, boxes, classes, low, cfg.low_match_iou, None)
        # Tentative tracks only get the high-score detections no confirmed track took, so a
        # false positive's track never steals an object's detection.
        left = np.ones(n, dtype=bool)
        left[d1] = False
        t3, d3 = self._associate(np.flatnonzero(~confirmed), boxes, classes, high[left[high]],
                                 cfg.match_iou, scores)
        left[d3] = False
        free[t2] = free[t3] = False
        carried = free & (self._skips > 0) & (self._lost <= _GATE_LOST) & ~self._stationary
        t4, d4 = self._reach(np.flatnonzero(carried), boxes, classes, high[left[high]])
        carried[t4] = False
        spare = np.ones(n, dtype=bool)
        spare[d2] = False
        t5, d5 = self._reach(np.flatnonzero(carried & confirmed), boxes, classes, low[spare[low]])
        d1 = np.concatenate((d1, d3, d4))
        t_m = np.concatenate((t1, t3, t4, t2, t5))
        d_m = np.concatenate((d1, d2, d5))
        self._start_velocity(t_m, boxes[d_m])
        waited = (self._tid[t_m] == 0) & (self._skips[t_m] > 0)  # may be confirmed now
        self._correct(t_m, boxes[d_m], classes[d_m])
        self._score[t_m] = scores[d_m]
        self._settle(t_m, boxes[d_m])
        ended = self._age(t_m, recheck)
        ids[d_m] = self._tid[t_m]
        out[d_m] = _xyxy(self._mean[t_m])
        earlier = None
        now = waited & (self._tid[t_m] > 0)
        if now.any():
            earlier = np.full((n, 4), np.nan)
            earlier[d_m[now]] = self._origin[t_m[now]]
        used = np.zeros(n, dtype=bool)
        used[d1] = True
        born = high[~used[high] & (scores[high] >= cfg.new_track_threshold)]
        self._drop(ids)
        if len(born):
            self._birth(boxes[born], classes[born], scores[born])
            ids[born] = self._tid[-len(born):]
        self._first = False
        unconfirmed = ids <= 0
        ids[unconfirmed] = -1
        out[unconfirmed] = boxes[unconfirmed]
        return TrackUpdate(ids, ended, out, earlier)

    def _predict(self) -> None:
        mean, cov = self._mean, self._cov
        t = len(mean)
        if t == 0:
            return
        self._since += 1
        # ByteTrack stops a lost track's height from drifting.
        mean[self._lost > 0, 7] = 0.0
        h = mean[:, 3]
        q = np.empty((t, 8))
        q[:, [0, 1, 3]] = (_W_POS * h)[:, None] ** 2
        q[:, 2] = 1e-4
        q[:, [4, 5, 7]] = (_W_VEL * h)[:, None] ** 2
        q[:, 6] = 1e-10
        mean[:, :4] += mean[:, 4:]
        # F P F^T for F = [[I, I], [0, I]], by blocks.
        cov[:, :4, :] += cov[:, 4:, :]
        cov[:, :, :4] += cov[:, :, 4:]
        cov.reshape(t, 64)[:, ::9] += q

    def _associate(self, trk: np.ndarray, boxes: np.ndarray, classes: np.ndarray,
                   det: np.ndarray, min_iou: float,
                   scores: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Match tracks ``trk`` with detections ``det`` (indices) by IoU, times the detections'
        ``scores`` where given; matched index pairs."""
        if len(trk) == 0 or len(det) == 0:
            return _NO_IDS, _NO_IDS
        iou = _iou(_xyxy(self._mean[trk]), boxes[det])
        if scores is not None:
            iou *= scores[det][None, :]
        if self._cfg.per_class:
            iou[self._cls[trk][:, None] != classes[det][None, :]] = 0.0
        ok = iou >= min_iou
        rows_ok = ok.sum(axis=1)
        cols_ok = ok.sum(axis=0)
        if rows_ok.max() <= 1 and cols_ok.max() <= 1:
            # Each track and detection has at most one candidate: the assignment is given.
            r, c = np.nonzero(ok)
            return trk[r], det[c]
        penalty = _LOST_PENALTY * np.minimum(self._lost[trk], _LOST_PENALTY_FRAMES)
        # A forbidden pair costs what the dearest allowed pair can cost: as much as leaving
        # both unmatched, so a full assignment of the rectangle loses nothing by including it.
        limit = 1.0 - min_iou + _LOST_PENALTY * _LOST_PENALTY_FRAMES
        cost = np.where(ok, 1.0 - iou + penalty[:, None], limit)
        r, c = linear_sum_assignment(cost)
        keep = ok[r, c]
        return trk[r[keep]], det[c[keep]]

    def _reach(self, trk: np.ndarray, boxes: np.ndarray, classes: np.ndarray,
               det: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Match tracks ``trk`` that frames without detections carried (IoU left them
        unmatched) with detections ``det`` by centre distance from the prediction, within
        ``_REACH`` sizes per frame since the track's last match; matched index pairs."""
        if len(trk) == 0 or len(det) == 0:
            return _NO_IDS, _NO_IDS
        mine = self._mean[trk]
        w, h = mine[:, 2] * mine[:, 3], mine[:, 3]
        theirs = _xyah(boxes[det])
        tw, th = theirs[:, 2] * theirs[:, 3], theirs[:, 3]
        reach = _REACH * np.sqrt(w * h) * self._since[trk]
        dist = np.hypot(mine[:, None, 0] - theirs[None, :, 0],
                        mine[:, None, 1] - theirs[None, :, 1])
        rel = dist / reach[:, None]
        wr, hr = tw[None, :] / w[:, None], th[None, :] / h[:, None]
        ok = ((rel <= 1.0) & (wr <= _SIZE_RATIO) & (wr >= 1 / _SIZE_RATIO)
              & (hr <= _SIZE_RATIO) & (hr >= 1 / _SIZE_RATIO))
        if self._cfg.per_class:
            ok &= self._cls[trk][:, None] == classes[det][None, :]
        if not ok.any():
            return _NO_IDS, _NO_IDS
        r, c = linear_sum_assignment(np.where(ok, rel, 1.0))
        keep = ok[r, c]
        return trk[r[keep]], det[c[keep]]

    def _start_velocity(self, trk: np.ndarray, boxes: np.ndarray) -> None:
        """Tracks ``trk`` matched for the second time after frames without detections take
        their velocity from their two detections (the filter would learn it over several, and
        its predictions would miss the object meanwhile); the first match, with motion
        unknown, has no lag to undo."""
        new = self._fresh[trk] & (self._skips[trk] > 0)
        self._fresh[trk] = False
        if not new.any():
            return
        t, z = trk[new], _xyah(boxes[new])
        mean = self._mean[t]
        # A fresh track has no velocity: its predicted box is where it was first detected.
        mean[:, 4:] = (z - mean[:, :4]) / self._since[t][:, None]
        mean[:, 6] = 0.0
        mean[:, :4] = z
        self._mean[t] = mean
        self._cov[t] = _start_cov(z[:, 3])

    def _correct(self, trk: np.ndarray, boxes: np.ndarray, classes: np.ndarray) -> None:
        """Kalman update of tracks ``trk`` with their matched boxes."""
        if len(trk) == 0:
            return
        mean, cov = self._mean[trk], self._cov[trk]
        z = _xyah(boxes)
        r = np.empty((len(trk), 4))
        r[:, [0, 1, 3]] = (_W_POS * mean[:, 3:4]) ** 2
        r[:, 2] = 1e-2
        s = cov[:, :4, :4].copy()
        s.reshape(len(trk), 16)[:, ::5] += r
        # K^T = S^-1 (P H^T)^T = S^-1 P[:4, :] since S and P are symmetric.
        kt = np.linalg.solve(s, cov[:, :4, :])
        innov = z - mean[:, :4]
        mean += np.einsum("tij,ti->tj", kt, innov)
        # K S K^T = K P[:4, :] because S K^T = P[:4, :].
        cov -= np.einsum("tki,tkj->tij", kt, cov[:, :4, :])
        self._mean[trk] = mean
        self._cov[trk] = cov
        self._cls[trk] = classes
        self._hits[trk] += 1
        self._lost[trk] = 0
        self._since[trk] = 0
        self._skips[trk] = 0

    def _settle(self, trk: np.ndarray, boxes: np.ndarray) -> None:
        """Count matched tracks ``trk`` that did not move from where they stopped; those still
        for ``stationary_after`` detections become stationary (their velocity zeroed)."""
        after = self._stationary_after
        if after is None or not len(trk):
            return
        iou = _iou(self._anchor[trk], boxes).diagonal()
        still = iou >= _STILL_IOU
        self._still[trk[still]] += 1
        moved = trk[~still]
        self._still[moved] = 0
        self._anchor[moved] = boxes[~still]
        self._stationary[moved] = False
        now = still & (self._still[trk] >= after)
        settled = trk[now]
        self._stationary[settled] = True
        # Where it stands is where it was last detected: no lag of the filter, no velocity.
        self._mean[settled, :4] = _xyah(boxes[now])
        self._mean[settled, 4:] = 0.0

    def _age(self, matched: np.ndarray, recheck: bool = True) -> tuple[int, ...]:
        """Count a missed frame on unmatched tracks (stationary ones only on a ``recheck``),
        confirm matched ones; ids that ended."""
        missed = np.ones(len(self._tid), dtype=bool)
        missed[matched] = False
        if not recheck:
            missed &= ~self._stationary
        self._lost[missed] += 1
        # A tentative track carried across frames without detections keeps its hits through
        # a miss (`_drop`): its next match confirms it.
        self._hits[missed & ~((self._tid == 0) & (self._skips > 0))] = 0
        new = np.flatnonzero((self._tid == 0) & (self._hits >= self._cfg.min_hits))
        if len(new):
            self._tid[new] = self._take_ids(len(new))
        gone = (self._tid > 0) & (self._lost > self._cfg.max_lost)
        return tuple(int(i) for i in self._tid[gone])

    def _drop(self, ids: np.ndarray) -> None:
        """Remove ended tracks and unmatched tentative ones (those carried across frames
        without detections after their second miss: an object the detector missed once
        between two far-apart detections is still one object)."""
        keep = ((self._lost == 0) | ((self._tid > 0) & (self._lost <= self._cfg.max_lost))
                | ((self._tid == 0) & (self._skips > 0) & (self._lost <= _TENTATIVE_LOST)))
        if keep.all():
            return
        self._mean, self._cov = self._mean[keep], self._cov[keep]
        self._tid, self._cls = self._tid[keep], self._cls[keep]
        self._hits, self._lost = self._hits[keep], self._lost[keep]
        self._score, self._anchor = self._score[keep], self._anchor[keep]
        self._still, self._stationary = self._still[keep], self._stationary[keep]
        self._since, self._skips = self._since[keep], self._skips[keep]
        self._fresh, self._origin = self._fresh[keep], self._origin[keep]

    def _birth(self, boxes: np.ndarray, classes: np.ndarray, scores: np.ndarray) -> None:
        m = len(boxes)
        mean = np.zeros((m, 8))
        mean[:, :4] = _xyah(boxes)
        h = mean[:, 3]
        cov = _start_cov(h)
        tid = np.zeros(m, dtype=np.int64)
        if self._cfg.min_hits <= 1 or self._first:
            tid[:] = self._take_ids(m)
        self._mean = np.concatenate((self._mean, mean))
        self._cov = np.concatenate((self._cov, cov))
        self._tid = np.concatenate((self._tid, tid))
        self._cls = np.concatenate((self._cls, classes))
        self._hits = np.concatenate((self._hits, np.ones(m, dtype=np.int64)))
        self._lost = np.concatenate((self._lost, np.zeros(m, dtype=np.int64)))
        self._score = np.concatenate((self._score, scores))
        self._anchor = np.concatenate((self._anchor, boxes))
        self._still = np.concatenate((self._still, np.zeros(m, dtype=np.int64)))
        self._stationary = np.concatenate((self._stationary, np.zeros(m, dtype=bool)))
        self._since = np.concatenate((self._since, np.zeros(m, dtype=np.int64)))
        self._skips = np.concatenate((self._skips, np.zeros(m, dtype=np.int64)))
        self._fresh = np.concatenate((self._fresh, np.ones(m, dtype=bool)))
        self._origin = np.concatenate((self._origin, boxes))

    def _take_ids(self, m: int) -> np.ndarray:
        first = self._next_id
        self._next_id += m
        return np.arange(first, first + m, dtype=np.int64)


def _checked(boxes: np.ndarray, scores: np.ndarray,
             classes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b = np.asarray(boxes, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    c = np.asarray(classes)
    if b.ndim != 2 or b.shape[1] != 4:
        if b.size == 0 and b.ndim <= 2:
            b = b.reshape(0, 4)
        else:
            raise InvalidInputError(f"boxes must have shape (N, 4) (x1, y1, x2, y2), got {b.shape}")
    if s.ndim != 1 or c.ndim != 1 or len(s) != len(b) or len(c) != len(b):
        raise InvalidInputError(f"scores and classes must have shape (N,) for {len(b)} boxes, got "
                                f"{s.shape} and {c.shape}")
    if c.dtype.kind not in "iub" and len(c) and not np.all(np.mod(c, 1) == 0):
        raise InvalidInputError(f"classes must be integer class ids, got {c.dtype} values")
    return b, s, c.astype(np.int64, copy=False)


def _start_cov(h: np.ndarray) -> np.ndarray:
    """ByteTrack's covariance of a track just started from a box of height ``h``."""
    m = len(h)
    std = np.empty((m, 8))
    std[:, [0, 1, 3]] = (2 * _W_POS * h)[:, None]
    std[:, 2] = 1e-2
    std[:, [4, 5, 7]] = (10 * _W_VEL * h)[:, None]
    std[:, 6] = 1e-5
    cov = np.zeros((m, 8, 8))
    cov.reshape(m, 64)[:, ::9] = std**2
    return cov


def _usable(boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        ok: np.ndarray = (np.isfinite(boxes).all(axis=1) & np.isfinite(scores)
                          & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]))
    return ok


def _xyah(boxes: np.ndarray) -> np.ndarray:
    out = np.empty((len(boxes), 4))
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    out[:, 0] = boxes[:, 0] + 0.5 * w
    out[:, 1] = boxes[:, 1] + 0.5 * h
    out[:, 2] = w / h
    out[:, 3] = h
    return out


def _xyxy(mean: np.ndarray) -> np.ndarray:
    out = np.empty((len(mean), 4))
    h = mean[:, 3]
    w = mean[:, 2] * h
    out[:, 0] = mean[:, 0] - 0.5 * w
    out[:, 1] = mean[:, 1] - 0.5 * h
    out[:, 2] = out[:, 0] + w
    out[:, 3] = out[:, 1] + h
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes ``a (T, 4)`` and ``b (D, 4)``, xyxy."""
    iw = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    ih = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    np.maximum(iw, 0.0, out=iw)
    np.maximum(ih, 0.0, out=ih)
    inter = iw * ih
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    iou: np.ndarray = inter / np.maximum(union, 1e-12)
    return iou
