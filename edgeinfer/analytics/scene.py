"""Zones and lines over tracked detections: ``enter``, ``exit``, ``loiter`` and ``cross`` events,
occupancy and totals.

Per frame the geometry is tested for all detections at once with numpy; Python runs per track
only where a state changes (an event). The per-track state of zones and lines, the frame's
detections as they see them and `SceneEvent` are in `zones`; this module holds the public
`Scene` and the totals' persistence.

Zones: an object enters after ``min_frames`` frames in a row with its anchor inside and leaves
after as many outside. Frames in which the track has no detection (occluded, or filtered out by
the zone's classes) neither count nor break the run, and never make an exit; only the tracker
ending the track does. Lines: a ``cross`` when the anchor's path from where the track was last
seen to where it is now crosses the segment between the line's end points. A point exactly on
the line keeps the side the object was on before, so an object moving along the line or
jittering on it counts once, when it leaves the line on the other side (and only if it left the
line between its end points).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..config.analytics import LineConfig, ZoneConfig, check_frame_size
from ..errors import ConfigError, StateError, StorageError
from .counters import CounterStore
from .geometry import Polygon
from .zones import ClassFilter, FrameDets, LineState, SceneEvent, TrackRows, ZoneState

__all__ = ["Scene", "SceneEvent"]

class Scene:
    """Zones and lines of one pipeline, fed with tracked detections frame by frame.

    Times of zone events are those of frames, so they are right to within one frame interval:
    an object crossed a zone's border between the last frame it was seen on one side and the
    first on the other. An ``enter`` has as ``start`` the first frame of the run seen inside,
    and is decided ``min_frames - 1`` frames later (its ``frame`` and ``clock``); an ``exit``
    has as ``end`` the first frame of the run seen outside, and ``dwell_s`` runs from ``start``
    to ``end``. ``loiter`` comes at the first frame seen inside with ``loiter_s`` since
    ``start``; frames seen outside before an exit is decided do not loiter.

    An object first detected already inside a zone enters it (it entered as far as the camera
    knows), with its first frame as ``start``. The scene sees a track only from the frame the
    tracker confirms it: detections of a tentative track (id -1, its first ``min_hits - 1``
    frames) are ignored, so for an object that appears inside a zone ``start`` is the frame its
    track got an id, ``min_hits - 1`` frames after its first detection; an object that walks in
    later is seen crossing as usual. Lines may be told where such a track was first detected
    (`seed`): a fast object crosses one between two detections of a motion-gated pipeline.

    Args:
        zones: The pipeline's zones.
        lines: The pipeline's lines.
        class_names: The model's labels, to resolve and check class filters; ``None``: filters
            match labels by string and ids by id at run time.
        where: Config path of the pipeline, for error messages.
        counters: Where totals persist; ``None``: they start at zero and are not saved.

    Raises:
        ConfigError: A class filter names a class the model does not have.
    """

    def __init__(self, zones: Sequence[ZoneConfig], lines: Sequence[LineConfig], *,
                 class_names: Sequence[str] | None, where: str = "$.pipelines[0]",
                 counters: CounterStore | None = None) -> None:
        self._where = where
        names = list(class_names) if class_names is not None else None
        self._tracks = TrackRows(64)
        self._zones = [ZoneState(z, ClassFilter(z.classes, names, f"{where}.zones[{i}]"), 64)
                       for i, z in enumerate(zones)]
        self._lines = [LineState(ln, ClassFilter(ln.classes, names, f"{where}.lines[{i}]"), 64)
                       for i, ln in enumerate(lines)]
        self._store = counters
        self._size: tuple[int, int] | None = None
        self._changed = True
        self._unsaved = False
        if counters is not None:
            self._restore(counters.load())

    def bind(self, width: int, height: int) -> None:
        """Put the geometry into pixels of a ``width`` x ``height`` frame; call before the first
        `update` and whenever the frame size changes.

        Raises:
            ConfigError: A pixel point lies outside the frame.
        """
        cfgs: list[tuple[str, int, ZoneConfig | LineConfig]] = [
            *(("zones", i, z.cfg) for i, z in enumerate(self._zones)),
            *(("lines", i, ln.cfg) for i, ln in enumerate(self._lines))]
        for kind, i, cfg in cfgs:
            problem = check_frame_size(cfg.points, cfg.coordinates, width, height)
            if problem:
                raise ConfigError(f"{self._where}.{kind}[{i}].points: {problem}")
        scale = np.array([width, height], dtype=np.float64)
        for zone in self._zones:
            zone.poly = Polygon.of(_pixels(zone.cfg, scale))
        for line in self._lines:
            line.a, line.b = _pixels(line.cfg, scale)
            if self._size is not None:
                # Last positions follow the new size, so the next path is no jump across lines.
                line.last *= (scale / self._size)[:, None]
        self._size = (width, height)

    def geometry(self) -> list[tuple[str, str, npt.NDArray[np.int32]]]:
        """``(name, "zone" | "line", int32 pixel points (M, 2))`` of each zone and line.

        Raises:
            StateError: `bind` was not called.
        """
        if self._size is None:
            raise StateError("Scene.geometry() before bind()")
        out: list[tuple[str, str, npt.NDArray[np.int32]]] = []
        for zone in self._zones:
            assert zone.poly is not None
            out.append((zone.name, "zone", np.rint(zone.poly.points).astype(np.int32)))
        for line in self._lines:
            out.append((line.name, "line", np.rint(np.stack([line.a, line.b])).astype(np.int32)))
        return out

    def update(self, clock: float, wall: float, frame: int, ids: npt.NDArray[np.int64],
               boxes: npt.NDArray[Any], classes: npt.NDArray[Any], scores: npt.NDArray[Any],
               labels: Sequence[str], ended: Sequence[int]) -> list[SceneEvent]:
        """Feed one frame's detections; return the events it decided.

        Args:
            clock: Scene clock (s) of the frame (dwell and loiter are measured on it).
            wall: Wall time (unix s) of the frame.
            frame: The frame's index.
            ids: ``(N,)`` track id of each detection, -1 for untracked ones (ignored).
            boxes: ``(N, 4)`` boxes ``x1, y1, x2, y2`` in pixels.
            classes: ``(N,)`` class ids.
            scores: ``(N,)`` scores.
            labels: The label of each detection.
            ended: Ids of the tracks that ended at this frame; one inside a zone exits it.

        Raises:
            StateError: `bind` was not called.
        """
        if self._size is None:
            raise StateError("Scene.update() before bind()")
        events: list[SceneEvent] = []
        crossed = False
        tracked = np.flatnonzero(np.asarray(ids) >= 0)
        if tracked.size:
            rows = self._rows_of(ids[tracked].tolist())
            d = FrameDets(self._tracks, rows, ids, boxes, classes, scores, labels, tracked, clock,
                          wall, frame)
            for zone in self._zones:
                zone.step(d, events)
            for line in self._lines:
                crossed |= line.step(d, events)
        for tid in ended:
            self._end(int(tid), clock, frame, events)
        if events or crossed:
            self._changed = self._unsaved = True
        if self._unsaved and self._store is not None:
            self._unsaved = not self._store.maybe_save(self._totals(), time.monotonic())
        return events

    def seed(self, ids: npt.NDArray[np.int64], boxes: npt.NDArray[np.float64]) -> None:
        """Tracks ``ids`` (``(K,)``, new to the scene) were at ``boxes`` (``(K, 4)``) before
        the next frame `update` is fed: a line they cross between there and that frame counts
        them. Zones are not told (an object is in a zone from the frames it is seen there).

        Raises:
            StateError: `bind` was not called.
        """
        if self._size is None:
            raise StateError("Scene.seed() before bind()")
        if not len(ids):
            return
        rows = self._rows_of(ids.tolist())
        for line in self._lines:
            line.seed(rows, boxes)

    def _rows_of(self, tids: list[int]) -> npt.NDArray[np.intp]:
        get = self._tracks.rows.get
        return np.fromiter((r if (r := get(t)) is not None else self._new_row(t) for t in tids),
                           np.intp, len(tids))

    def _new_row(self, tid: int) -> int:
        tracks = self._tracks
        if not tracks.free:
            tracks.grow()
            for item in self._items():
                item.grow(tracks.cap)
        row = tracks.rows[tid] = tracks.free.pop()
        return row

    def _items(self) -> list[ZoneState | LineState]:
        return [*self._zones, *self._lines]

    def _end(self, tid: int, clock: float, frame: int, events: list[SceneEvent]) -> None:
        row = self._tracks.rows.pop(tid, None)
        if row is None:
            return
        tracks = self._tracks
        for zone in self._zones:
            visit = zone.end(row, float(tracks.wall[row]), float(tracks.clock[row]))
            if visit is not None:
                start, t0, end, t1 = visit
                events.append(SceneEvent(
                    "exit", zone.name, None, tid, tracks.label[row], int(tracks.cls[row]),
                    float(tracks.score[row]), None, start, end, frame, t1 - t0, clock, t0))
        for item in self._items():
            item.release(row)
        self._tracks.free.append(row)

    @property
    def changed(self) -> bool:
        """Whether the counts changed since the last call to `counts`."""
        return self._changed

    def counts(self) -> dict[str, Any]:
        """Occupancy and totals: ``{"zones": {name: {"occupancy", "entered", "exited",
        "loiter"}}, "lines": {name: {"in", "out"}}}``; clears `changed`."""
        self._changed = False
        return {"zones": {z.name: {"occupancy": z.occupancy, "entered": z.entered,
                                   "exited": z.exited, "loiter": z.loiter} for z in self._zones},
                "lines": {ln.name: dict(ln.totals) for ln in self._lines}}

    def reset(self, names: Sequence[str] | None = None) -> list[str]:
        """Zero the totals of the named zones and lines (all when ``None``) and save at once;
        occupancy is the present state and stays.

        Returns:
            The names reset.

        Raises:
            ValueError: A name is not a zone or line of this scene.
            StorageError: The counters cannot be saved.
        """
        valid = [z.name for z in self._zones] + [ln.name for ln in self._lines]
        chosen = valid if names is None else list(dict.fromkeys(names))
        unknown = [n for n in chosen if n not in valid]
        if unknown:
            raise ValueError(f"unknown zone or line {', '.join(map(repr, unknown))}; valid "
                             f"names: {', '.join(valid) or '(none)'}")
        for zone in self._zones:
            if zone.name in chosen:
                zone.entered = zone.exited = zone.loiter = 0
        for line in self._lines:
            if line.name in chosen:
                line.totals = {"in": 0, "out": 0}
        self._changed = True
        self._save()
        return chosen

    def close(self) -> None:
        """Save the totals now.

        Raises:
            StorageError: The counters cannot be saved.
        """
        self._save()

    def _save(self) -> None:
        if self._store is None:
            return
        try:
            self._store.save(self._totals())
        except OSError as exc:
            raise StorageError(f"counters {self._store.path} cannot be saved: {exc}") from exc
        self._unsaved = False

    def _totals(self) -> dict[str, Any]:
        return {"zones": {z.name: {"entered": z.entered, "exited": z.exited, "loiter": z.loiter}
                          for z in self._zones},
                "lines": {ln.name: dict(ln.totals) for ln in self._lines}}

    def _restore(self, loaded: dict[str, Any]) -> None:
        zones, lines = loaded.get("zones", {}), loaded.get("lines", {})
        for zone in self._zones:
            row = zones.get(zone.name, {})
            zone.entered, zone.exited = row.get("entered", 0), row.get("exited", 0)
            zone.loiter = row.get("loiter", 0)
        for line in self._lines:
            row = lines.get(line.name, {})
            line.totals = {"in": row.get("in", 0), "out": row.get("out", 0)}
        # Totals of zones and lines no longer configured go at the next save.
        self._unsaved = (not zones.keys() <= {z.name for z in self._zones}
                         or not lines.keys() <= {ln.name for ln in self._lines})


def _pixels(cfg: ZoneConfig | LineConfig, scale: npt.NDArray[np.float64],
            ) -> npt.NDArray[np.float64]:
    pts = np.asarray(cfg.points, dtype=np.float64)
    return pts * scale if cfg.coordinates == "normalized" else pts
