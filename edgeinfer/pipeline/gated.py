"""The emit stage's side of detection gating: what a frame becomes when the model saw it and
when the gate kept it from the model, and what the gate learns back (`GatedFrames`).

A frame the model saw goes through the tracker as usual, with the frame's motion (stationary
tracks under it move again) and whether it was a keep-alive re-check (stationary tracks it
misses age). A skipped frame gets the tracker's predicted boxes of the live tracks (each a copy
of its last detection: label, class, score; the box moved; no keypoints or mask), which go
through zones, lines and the recorder like detections. A pipeline without tracking repeats its
last detections on skipped frames. After each frame the gate hears where the moving tracks are
(without tracking: the last detections, which widen a crop but do not run the model: nothing
says they move), and a detection cut by a crop edge makes the next
detection frame the whole frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..frames import Frame, TaskResult
from .gate import DetectGate, GateDecision

if TYPE_CHECKING:
    from ..analytics.stage import SceneAnalytics

__all__ = ["GatedFrames"]

Events = list[dict[str, Any]]
_NO_EVENTS: Events = []


class GatedFrames:
    """Turns a gated pipeline's frames into results, in the emit thread.

    Args:
        gate: The pipeline's detection gate.
        analytics: Its tracking, zones and lines (``None``: untracked).
    """

    def __init__(self, gate: DetectGate, analytics: SceneAnalytics | None) -> None:
        self.gate = gate
        self.analytics = analytics
        self._held: TaskResult | None = None

    def detected(self, frame: Frame, part: TaskResult, decision: GateDecision
                 ) -> tuple[TaskResult, Events]:
        """``part``, what the model found in ``frame``, tracked; and the frame's events."""
        gate, analytics = self.gate, self.analytics
        region = decision.region
        if region is not None and part.detections and gate.touches_inner_edge(
                region, frame.width, frame.height, _boxes(part)):
            gate.widen()
        if analytics is None:
            self._held = part
            gate.hold(_boxes(part))
            return part, _NO_EVENTS
        part, events = analytics.process(frame, part, motion=decision.motion,
                                         recheck=decision.recheck)
        gate.observe(analytics.tracker.live_boxes()[0])
        return part, events

    def skipped(self, frame: Frame, decision: GateDecision
                ) -> tuple[TaskResult | None, Events]:
        """What ``frame``, which the model did not see, shows: the tracks' predicted boxes, or
        the last detections (``None`` before any); and its events."""
        analytics = self.analytics
        if analytics is None:
            return self._held, _NO_EVENTS
        part, events = analytics.predict(frame, motion=decision.motion)
        self.gate.observe(analytics.tracker.live_boxes()[0])
        return part, events


def _boxes(part: TaskResult) -> npt.NDArray[np.float64]:
    dets = part.detections or ()
    return np.array([d.box for d in dets], dtype=np.float64).reshape(len(dets), 4)
