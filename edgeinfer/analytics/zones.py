"""Per-track state of zones and lines: the debounce of zone visits and the side of a line,
the frame's detections as they see them (`FrameDets`) and the events they make (`SceneEvent`).

State lives in arrays indexed by a row (`TrackRows`) that a track keeps until the tracker reports
it ended; a frame updates the rows of the tracks it has in a few numpy operations, and Python
runs per track only where a state changes (an event). `Scene` (in `scene`) owns these objects
and the rules they follow are described there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ..config.analytics import Anchor, LineConfig, ZoneConfig
from ..errors import ConfigError
from .geometry import Polygon, anchor_points, crosses_segment, side_of_line

__all__ = ["ClassFilter", "EventType", "FrameDets", "LineState", "SceneEvent", "TrackRows",
           "ZoneState"]

EventType = Literal["enter", "exit", "cross", "loiter"]


@dataclass(frozen=True, slots=True)
class SceneEvent:
    """Something a tracked object did in a zone or at a line.

    Attributes:
        type: ``enter``, ``exit``, ``loiter`` (a zone) or ``cross`` (a line).
        zone: The zone's name (enter, exit, loiter), else ``None``.
        line: The line's name (cross), else ``None``.
        track_id: The tracker's id of the object.
        label: The detection's label.
        class_id: The detection's class id.
        score: The detection's score in the event's frame (the exit of an ended track: the
            score when it was last seen).
        direction: ``in`` or ``out`` (cross), else ``None``.
        start: Wall time (unix s): when the object entered (its first frame inside, before the
            debounce frames) for enter, exit and loiter; the crossing frame's for cross.
        end: Exit only: wall time of the first frame seen outside (a track that ended inside:
            the first frame of the outside run it was last seen in, else the last frame it was
            seen).
        frame: Index of the frame where the event was decided.
        dwell_s: Exit and loiter: time inside so far on the scene clock.
        clock: Scene clock (s) of the event's frame.
        t_start: Scene clock of ``start``.
    """

    type: EventType
    zone: str | None
    line: str | None
    track_id: int
    label: str
    class_id: int
    score: float
    direction: Literal["in", "out"] | None
    start: float
    end: float | None
    frame: int
    dwell_s: float | None
    clock: float
    t_start: float

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready values: ``clock`` as ``t``, both scene clocks rounded to ms;
        fields that are ``None`` stay (as null)."""
        return {"type": self.type, "zone": self.zone, "line": self.line,
                "track_id": self.track_id, "label": self.label, "class_id": self.class_id,
                "score": self.score, "direction": self.direction, "start": self.start,
                "end": self.end, "frame": self.frame, "dwell_s": self.dwell_s,
                "t": round(self.clock, 3), "t_start": round(self.t_start, 3)}


class ClassFilter:
    """The classes a zone or line sees: ids checked against the model, or label strings
    matched at run time when the model has no names."""

    __slots__ = ("ids", "names")

    def __init__(self, classes: Sequence[str | int] | None, class_names: Sequence[str] | None,
                 where: str) -> None:
        self.ids: npt.NDArray[np.int64] | None = None
        self.names: frozenset[str] = frozenset()
        if classes is None:
            return
        ids: list[int] = []
        names: set[str] = set()
        for j, c in enumerate(classes):
            if class_names is None:
                if isinstance(c, str):
                    names.add(c)
                else:
                    ids.append(c)
            elif isinstance(c, str) and c in class_names:
                ids.extend(k for k, n in enumerate(class_names) if n == c)
            elif isinstance(c, int) and c < len(class_names):
                ids.append(c)
            else:
                shown = ", ".join(class_names[:20]) + (", ..." if len(class_names) > 20 else "")
                raise ConfigError(f"{where}.classes[{j}]: unknown class {c!r}; the model's "
                                  f"labels: {shown}")
        self.ids = np.array(sorted(set(ids)), dtype=np.int64)
        self.names = frozenset(names)

    def mask(self, classes: npt.NDArray[Any], labels: Sequence[str],
             idx: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_] | None:
        """Which of the detections ``idx`` (with ``classes``) the filter lets through;
        ``None``: all of them."""
        if self.ids is None:
            return None
        seen = np.isin(classes, self.ids)
        if self.names:
            seen |= np.fromiter((labels[i] in self.names for i in idx.tolist()), np.bool_,
                                idx.size)
        return seen


def _grown(arr: npt.NDArray[Any], cap: int) -> npt.NDArray[Any]:
    out = np.zeros(arr.shape[:-1] + (cap,), dtype=arr.dtype)
    out[..., :arr.shape[-1]] = arr
    return out


class TrackRows:
    """Rows of per-track state: a track keeps its row until it ends; rows are reused."""

    __slots__ = ("rows", "free", "cap", "wall", "clock", "score", "cls", "label")

    def __init__(self, cap: int) -> None:
        self.rows: dict[int, int] = {}
        self.free = list(range(cap - 1, -1, -1))
        self.cap = cap
        self.wall, self.clock, self.score = np.zeros(cap), np.zeros(cap), np.zeros(cap)
        self.cls = np.zeros(cap, dtype=np.int64)
        self.label = [""] * cap

    def grow(self) -> None:
        old, cap = self.cap, self.cap * 2
        self.wall, self.clock = _grown(self.wall, cap), _grown(self.clock, cap)
        self.score, self.cls = _grown(self.score, cap), _grown(self.cls, cap)
        self.label += [""] * (cap - old)
        self.free.extend(range(cap - 1, old - 1, -1))
        self.cap = cap


# Columns of ZoneState.times: when the current run of frames began, and when the visit began.
_RUN_WALL, _RUN_CLOCK, _IN_WALL, _IN_CLOCK = range(4)


class ZoneState:
    """A zone's config, totals and per-track state (arrays indexed by track row)."""

    __slots__ = ("cfg", "name", "seen", "poly", "entered", "exited", "loiter", "occupancy",
                 "inside", "loitered", "run", "times")

    def __init__(self, cfg: ZoneConfig, seen: ClassFilter, cap: int) -> None:
        self.cfg, self.name, self.seen = cfg, cfg.name, seen
        self.poly: Polygon | None = None
        self.entered = self.exited = self.loiter = self.occupancy = 0
        self.inside = np.zeros(cap, dtype=np.bool_)
        self.loitered = np.zeros(cap, dtype=np.bool_)
        self.run = np.zeros(cap, dtype=np.int32)  # frames in a row seen on the other side
        self.times = np.zeros((4, cap))

    def grow(self, cap: int) -> None:
        self.inside, self.loitered = _grown(self.inside, cap), _grown(self.loitered, cap)
        self.run, self.times = _grown(self.run, cap), _grown(self.times, cap)

    def release(self, row: int) -> None:
        self.inside[row] = self.loitered[row] = False
        self.run[row] = 0

    def step(self, d: FrameDets, events: list[SceneEvent]) -> None:
        pts, rows, js = d.view(self.seen, self.cfg.anchor)
        assert self.poly is not None
        run = np.where(self.poly.contains(pts) != self.inside[rows], self.run[rows] + 1, 0)
        self.run[rows] = run
        fresh = rows[run == 1]
        if fresh.size:
            self.times[_RUN_WALL, fresh] = d.wall
            self.times[_RUN_CLOCK, fresh] = d.clock
        for j in np.flatnonzero(run >= self.cfg.min_frames).tolist():
            events.append(self._flip(int(rows[j]), d, int(js[j])))
        if self.cfg.loiter_s is not None:
            self._loiter(self.cfg.loiter_s, rows, js, d, events)

    def _flip(self, row: int, d: FrameDets, j: int) -> SceneEvent:
        self.run[row] = 0
        since_wall, since_clock = self.times[_RUN_WALL:_RUN_CLOCK + 1, row].tolist()
        if not self.inside[row]:
            self.inside[row], self.loitered[row] = True, False
            self.times[_IN_WALL, row], self.times[_IN_CLOCK, row] = since_wall, since_clock
            self.entered += 1
            self.occupancy += 1
            return d.event(j, "enter", zone=self.name, start=since_wall, t_start=since_clock)
        self.inside[row] = False
        self.exited += 1
        self.occupancy -= 1
        t0 = float(self.times[_IN_CLOCK, row])
        return d.event(j, "exit", zone=self.name, start=float(self.times[_IN_WALL, row]),
                       t_start=t0, end=since_wall, dwell_s=since_clock - t0)

    def _loiter(self, loiter_s: float, rows: npt.NDArray[np.intp], js: npt.NDArray[np.intp],
                d: FrameDets, events: list[SceneEvent]) -> None:
        # Seen outside (an exit the debounce has not decided yet) is not loitering.
        waiting = self.inside[rows] & ~self.loitered[rows] & (self.run[rows] == 0)
        if not waiting.any():
            return
        due = waiting & (d.clock - self.times[_IN_CLOCK, rows] >= loiter_s)
        for j in np.flatnonzero(due).tolist():
            row = int(rows[j])
            self.loitered[row] = True
            self.loiter += 1
            t0 = float(self.times[_IN_CLOCK, row])
            events.append(d.event(int(js[j]), "loiter", zone=self.name, t_start=t0,
                                  start=float(self.times[_IN_WALL, row]), dwell_s=d.clock - t0))

    def end(self, row: int, last_wall: float, last_clock: float,
            ) -> tuple[float, float, float, float] | None:
        """Count the exit of a track that ended inside; ``None`` if it was not inside.

        Returns:
            When its visit began and ended (wall, clock, wall, clock): the end is the first
            frame of the run it was last seen outside in, else its last sighting.
        """
        if not self.inside[row]:
            return None
        self.exited += 1
        self.occupancy -= 1
        if self.run[row]:
            last_wall, last_clock = self.times[_RUN_WALL:_RUN_CLOCK + 1, row].tolist()
        return (float(self.times[_IN_WALL, row]), float(self.times[_IN_CLOCK, row]), last_wall,
                last_clock)


class LineState:
    """A line's config, totals and per-track state: last anchor position and side."""

    __slots__ = ("cfg", "name", "seen", "a", "b", "directions", "totals", "last", "side",
                 "seen_at")

    def __init__(self, cfg: LineConfig, seen: ClassFilter, cap: int) -> None:
        self.cfg, self.name, self.seen = cfg, cfg.name, seen
        self.a = self.b = np.zeros(2)
        self.directions = frozenset(cfg.directions)
        self.totals = {"in": 0, "out": 0}
        self.last = np.zeros((2, cap))  # x and y where each track was last seen
        self.side = np.zeros(cap, dtype=np.int8)  # -1 left, +1 right, 0 not known yet
        self.seen_at = np.zeros(cap, dtype=np.bool_)

    def grow(self, cap: int) -> None:
        self.last, self.side = _grown(self.last, cap), _grown(self.side, cap)
        self.seen_at = _grown(self.seen_at, cap)

    def release(self, row: int) -> None:
        self.side[row], self.seen_at[row] = 0, False

    def seed(self, rows: npt.NDArray[np.intp], boxes: npt.NDArray[np.float64]) -> None:
        """Tracks ``rows`` were seen earlier at ``boxes`` (``(K, 4)``) and not by this line:
        their next frame may cross it."""
        pts = anchor_points(boxes, self.cfg.anchor)
        self.last[:, rows] = pts.T
        self.side[rows] = np.sign(side_of_line(pts, self.a, self.b)).astype(np.int8)
        self.seen_at[rows] = True

    def step(self, d: FrameDets, events: list[SceneEvent]) -> bool:
        """Feed a frame; whether the totals changed."""
        pts, rows, js = d.view(self.seen, self.cfg.anchor)
        side = np.sign(side_of_line(pts, self.a, self.b)).astype(np.int8)
        old = self.side[rows]
        moved = np.flatnonzero(self.seen_at[rows] & (old != 0) & (side != 0) & (side != old))
        crossed: list[int] = []
        if moved.size:
            prev = self.last[:, rows[moved]].T
            crossed = moved[crosses_segment(prev, pts[moved], self.a, self.b)].tolist()
            for j in crossed:
                direction: Literal["in", "out"] = "in" if side[j] > 0 else "out"
                self.totals[direction] += 1
                if direction in self.directions:
                    events.append(d.event(int(js[j]), "cross", line=self.name,
                                          direction=direction, start=d.wall, t_start=d.clock))
        self.last[:, rows] = pts.T
        self.seen_at[rows] = True
        self.side[rows] = np.where(side != 0, side, old)
        return bool(crossed)


class FrameDets:
    """One frame's tracked detections as the zones and lines see them; writes what the frame
    says of each track (time, score, class, label) into its row of ``tracks``.

    ``idx`` are the positions of the tracked detections among ``ids``, ``rows`` their state
    rows (`Scene` gives a new track its row before the frame is seen).
    """

    __slots__ = ("ids", "idx", "rows", "boxes", "classes", "scores", "labels", "clock", "wall",
                 "frame", "_anchors")

    def __init__(self, tracks: TrackRows, rows: npt.NDArray[np.intp], ids: npt.NDArray[np.int64],
                 boxes: npt.NDArray[Any], classes: npt.NDArray[Any], scores: npt.NDArray[Any],
                 labels: Sequence[str], idx: npt.NDArray[np.intp], clock: float, wall: float,
                 frame: int) -> None:
        self.ids, self.idx, self.labels = ids, idx, labels
        self.clock, self.wall, self.frame = clock, wall, frame
        all_in = idx.size == len(ids)
        self.boxes = boxes if all_in else boxes[idx]
        self.classes = classes if all_in else classes[idx]
        self.scores = scores if all_in else scores[idx]
        self.rows = rows
        self._anchors: dict[str, npt.NDArray[np.float64]] = {}
        tracks.wall[rows] = wall
        tracks.clock[rows] = clock
        tracks.score[rows] = self.scores
        tracks.cls[rows] = self.classes
        tl = tracks.label
        for r, i in zip(rows.tolist(), idx.tolist()):
            tl[r] = labels[i]

    def view(self, seen: ClassFilter, anchor: Anchor,
             ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
        """Anchor points, state rows and positions (in the tracked subset) of the detections
        that pass ``seen``."""
        pts = self._anchors.get(anchor)
        if pts is None:
            pts = self._anchors[anchor] = anchor_points(self.boxes, anchor)
        mask = seen.mask(self.classes, self.labels, self.idx)
        if mask is None:
            return pts, self.rows, np.arange(self.rows.size)
        js = np.flatnonzero(mask)
        return pts[js], self.rows[js], js

    def event(self, j: int, type: EventType, *, zone: str | None = None,
              line: str | None = None, direction: Literal["in", "out"] | None = None,
              start: float, t_start: float, end: float | None = None,
              dwell_s: float | None = None) -> SceneEvent:
        """An event of the ``j``-th tracked detection in this frame."""
        i = int(self.idx[j])
        return SceneEvent(type, zone, line, int(self.ids[i]), self.labels[i],
                          int(self.classes[j]), float(self.scores[j]), direction, start, end,
                          self.frame, dwell_s, self.clock, t_start)
