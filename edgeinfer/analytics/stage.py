"""`SceneAnalytics`: the pipeline's analytics step, run in its emit thread on every processed
frame (before the emission policy, so tracking never skips a frame).

Per frame: the detections get track ids, the scene turns tracks into zone and line events and
counts, and the recorder keeps encoded frames for snapshots and clips. A frame the model did not
see (motion gating, ``docs/motion.md``) gets the tracker's predicted boxes instead (`predict`),
so zones, lines and clips still see every frame. Each event becomes a
JSON-ready dict (``docs/analytics.md``) that the pipeline hands to its sinks (the MQTT sink
puts it in the outbox for ``<prefix>/<dev>/<pipeline>/event``) and adds to the next result.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..frames import DETECTIONS, Detection, Frame, TaskResult

if TYPE_CHECKING:
    from ..config import PipelineConfig
    from .draw import Geometry
    from .recorder import Recorder
    from .scene import Scene
    from .tracker import ByteTracker

logger = logging.getLogger(__name__)

__all__ = ["SceneAnalytics", "media_dir"]

_NO_EVENTS: list[dict[str, Any]] = []
_NO_MEDIA = dict.fromkeys(("snapshot", "snapshot_pending", "snapshot_missing", "clip",
                           "clip_format", "clip_missing", "clip_remux"))
RECENT_EVENTS = 200  # events kept in memory for the web view (all are on MQTT and in results)


def media_dir(state_dir: Path, pipeline: str) -> Path:
    """Where a pipeline's event snapshots and clips are kept."""
    return state_dir / "media" / pipeline


class SceneAnalytics:
    """Tracker, scene and recorder of one pipeline.

    Args:
        pc: The pipeline's config (``track``, ``zones``, ``lines``, ``record``).
        class_names: The task's labels (class filters are checked against them).
        state_dir: Counters go to ``<state>/analytics/<pipeline>.json``, media under
            ``<state>/media/<pipeline>/``.
        where: The pipeline's YAML path, for errors (``$.pipelines[2]``).

    Raises:
        ConfigError: a class filter names an unknown class.
    """

    def __init__(self, pc: PipelineConfig, *, class_names: list[str] | None, state_dir: Path,
                 where: str = "$.pipelines[0]") -> None:
        from .tracker import ByteTracker

        self.pipeline = pc.name
        tracking = pc.tracking
        assert tracking is not None, "SceneAnalytics needs a tracked pipeline"
        stationary = pc.detect.stationary_after if pc.gate == "motion" else None
        self.tracker: ByteTracker = ByteTracker(tracking, stationary_after=stationary)
        self._seen: dict[int, Detection] = {}  # each track's last detection (predict copies it)
        self.scene: Scene | None = None
        self.recorder: Recorder | None = None
        self._size: tuple[int, int] | None = None
        self._run = secrets.token_hex(4)  # event ids stay unique across restarts
        self.run_id = ""  # the pipeline's (start): in every event from its creation on
        self._events = 0
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)  # the web view's list
        if pc.zones or pc.lines:
            from .counters import CounterStore
            from .scene import Scene

            store = CounterStore(state_dir / "analytics" / f"{pc.name}.json")
            self.scene = Scene(pc.zones, pc.lines, class_names=class_names, where=where,
                               counters=store)
        if pc.record is not None:
            from .recorder import Recorder

            self.recorder = Recorder(pc.name, pc.record, media_dir(state_dir, pc.name),
                                     geometry=self.geometry)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, run_id: str = "") -> None:
        """Start the recorder; ``run_id`` (the pipeline's, new at each start) goes into every
        event as it is made: the web view may be reading an event already, so no key is added
        to it later."""
        self.run_id = run_id
        if self.recorder is not None:
            self.recorder.start()

    def close(self) -> None:
        """Write pending clips with what they have and save the counters."""
        if self.recorder is not None:
            self.recorder.close()
        if self.scene is not None:
            self.scene.close()

    # -- per frame ------------------------------------------------------------------------------
    def process(self, frame: Frame, part: TaskResult, *, motion: np.ndarray | None = None,
                recheck: bool = True) -> tuple[TaskResult, list[dict[str, Any]]]:
        """Track ``part``'s detections; returns the result with track ids and the frame's
        events (JSON-ready dicts).

        Args:
            frame: The frame the model saw.
            part: What the task made of it.
            motion: ``(M, 4)`` boxes that moved in this frame (motion gating): stationary
                tracks under them move again.
            recheck: The model looked at the whole frame to re-check it: stationary tracks it
                misses age (see `ByteTracker.update`).

        Raises:
            ConfigError: pixel zone or line points outside this frame's size.
        """
        if motion is not None and len(motion):
            self.tracker.touch(motion)
        dets = part.detections or ()
        n = len(dets)
        boxes = np.array([d.box for d in dets], dtype=np.float64).reshape(n, 4)
        scores = np.fromiter((d.score for d in dets), dtype=np.float64, count=n)
        classes = np.fromiter((d.class_id for d in dets), dtype=np.int64, count=n)
        update = self.tracker.update(boxes, scores, classes, recheck=recheck)
        ids = update.ids.tolist()
        tracked = tuple(
            Detection(d.label, d.class_id, d.score, d.box, i, d.keypoints, d.mask, d.area)
            if i >= 0 else d
            for d, i in zip(dets, ids, strict=True))
        seen = self._seen
        for d in tracked:
            if d.track_id is not None:
                seen[d.track_id] = d
        for tid in update.ended:
            seen.pop(tid, None)
        events = self._scene(frame, update.ids, boxes, classes, scores, [d.label for d in dets],
                             update.ended, update.earlier)
        if self.recorder is not None:
            self.recorder.offer(frame, self._clock(frame), tracked)  # drawn as they are
        return TaskResult(part.kind, tracked), events

    def predict(self, frame: Frame, *, motion: np.ndarray | None = None
                ) -> tuple[TaskResult, list[dict[str, Any]]]:
        """A frame the model did not see: the live tracks at their predicted boxes (each a
        copy of its last detection, with that detection's score and label, the box moved and
        no keypoints or mask), through zones, lines and the recorder as `process` does."""
        if motion is not None and len(motion):
            self.tracker.touch(motion)
        p = self.tracker.predict()
        seen = self._seen
        # Every live confirmed track was matched at the last detection frame, so it is seen.
        tracked = tuple(
            Detection(d.label, d.class_id, d.score, (b[0], b[1], b[2], b[3]), tid)
            for tid, b in zip(p.ids.tolist(), p.boxes.tolist(), strict=True)
            if (d := seen.get(tid)) is not None)
        labels = [d.label for d in tracked]
        events = self._scene(frame, p.ids, p.boxes, p.classes, p.scores, labels, ())
        if self.recorder is not None:
            self.recorder.offer(frame, self._clock(frame), tracked)
        return TaskResult(DETECTIONS, tracked), events

    @staticmethod
    def _clock(frame: Frame) -> float:
        return frame.start if frame.start is not None else frame.ts

    def _scene(self, frame: Frame, ids: np.ndarray, boxes: np.ndarray, classes: np.ndarray,
               scores: np.ndarray, labels: list[str], ended: tuple[int, ...],
               earlier: np.ndarray | None = None) -> list[dict[str, Any]]:
        scene = self.scene
        if scene is None:
            return _NO_EVENTS
        size = (frame.width, frame.height)
        if size != self._size:
            scene.bind(*size)
            self._size = size
        if earlier is not None:  # tracks confirmed now, first detected before (TrackUpdate)
            known = ~np.isnan(earlier[:, 0])
            scene.seed(ids[known], earlier[known])
        found = scene.update(self._clock(frame), frame.wall, frame.index, ids, boxes, classes,
                             scores, labels, ended)
        if not found:
            return _NO_EVENTS
        events = [self._event(e) for e in found]
        self.recent.extend(events)
        return events

    def _event(self, e: Any) -> dict[str, Any]:
        self._events += 1
        event_id = f"{self.pipeline}-{self._run}-{self._events}"
        data: dict[str, Any] = {"event_id": event_id, "pipeline": self.pipeline,
                                "run_id": self.run_id, **e.to_dict(), **_NO_MEDIA}
        if self.recorder is not None:  # before the frame's offer: the snapshot may show it
            self.recorder.on_event(event_id, e.type, e.track_id, e.clock, data)
        return data

    # -- control and reporting ------------------------------------------------------------------
    def geometry(self) -> Geometry:
        """Zones and lines in pixels of the current frame size, for drawing."""
        return self.scene.geometry() if self.scene is not None and self._size else []

    def counts(self) -> dict[str, Any] | None:
        """Zone occupancy and totals, line crossings by direction (``None``: no zones or
        lines)."""
        return self.scene.counts() if self.scene is not None else None

    def reset(self, names: list[str] | None = None) -> list[str]:
        """Zero the totals of the named zones and lines (all when ``None``).

        Raises:
            ValueError: an unknown name, or no zones and lines.
        """
        if self.scene is None:
            raise ValueError(f"pipeline {self.pipeline!r} has no zones or lines")
        return list(self.scene.reset(names))

    def event_snapshot(self, event_id: str) -> bytes | None:
        """The annotated JPEG of one of this pipeline's events, if it was written."""
        return self.recorder.snapshot(event_id) if self.recorder is not None else None

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = {"tracks": self.tracker.active, "events": self._events,
                                "stationary": self.tracker.stationary}
        if self.scene is not None:
            data["counts"] = self.scene.counts()
        if self.recorder is not None:
            data["media"] = self.recorder.stats()
        return data
