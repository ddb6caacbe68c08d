"""`SceneAnalytics`: the pipeline's analytics step, run in its emit thread on every processed
frame (before the emission policy, so tracking never skips a frame).

Per frame: the detections get track ids, the scene turns tracks into zone and line events and
counts, and the recorder keeps encoded frames for snapshots and clips. Each event becomes a
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

from ..frames import Detection, Frame, TaskResult

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
                           "clip_format", "clip_missing"))
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
        self.tracker: ByteTracker = ByteTracker(tracking)
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
    def process(self, frame: Frame, part: TaskResult) -> tuple[TaskResult, list[dict[str, Any]]]:
        """Track ``part``'s detections; returns the result with track ids and the frame's
        events (JSON-ready dicts).

        Raises:
            ConfigError: pixel zone or line points outside this frame's size.
        """
        dets = part.detections or ()
        n = len(dets)
        boxes = np.array([d.box for d in dets], dtype=np.float64).reshape(n, 4)
        scores = np.fromiter((d.score for d in dets), dtype=np.float64, count=n)
        classes = np.fromiter((d.class_id for d in dets), dtype=np.int64, count=n)
        update = self.tracker.update(boxes, scores, classes)
        ids = update.ids.tolist()
        tracked = tuple(
            Detection(d.label, d.class_id, d.score, d.box, i, d.keypoints, d.mask, d.area)
            if i >= 0 else d
            for d, i in zip(dets, ids, strict=True))
        clock = frame.start if frame.start is not None else frame.ts
        events = _NO_EVENTS
        scene = self.scene
        if scene is not None:
            size = (frame.width, frame.height)
            if size != self._size:
                scene.bind(*size)
                self._size = size
            found = scene.update(clock, frame.wall, frame.index, update.ids, boxes, classes, scores,
                                 [d.label for d in dets], update.ended)
            if found:
                events = [self._event(e) for e in found]
                self.recent.extend(events)
        if self.recorder is not None:
            self.recorder.offer(frame, clock, tracked)  # detections are drawn as they are
        return TaskResult(part.kind, tracked), events

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
        data: dict[str, Any] = {"tracks": self.tracker.active, "events": self._events}
        if self.scene is not None:
            data["counts"] = self.scene.counts()
        if self.recorder is not None:
            data["media"] = self.recorder.stats()
        return data
