"""The emission policy (``emit: {mode, min_interval_s}``): which processed frames become results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..frames import Frame, TaskResult

if TYPE_CHECKING:
    from ..config.pipeline import EmitConfig


Offered = tuple[Frame, TaskResult, float, bool]
"""A processed frame, what the task made of it, its postprocessing ms, and whether the model
saw it (a motion-gated pipeline passes frames by the model)."""


class Emission:
    """``emit: {mode, min_interval_s}``: decides which processed frames become results.

    In ``change`` mode a result is emitted when the task's ``change_key`` differs from the last
    emitted one (and always on an event its part marks: a VAD segment's start or end). With
    ``min_interval_s`` a result that is due too early is held and the newest held one goes out
    when the interval has passed (or at the end of the stream), so a change is delayed, never
    lost. Each offered frame carries whether the model saw it (``detected``) along to its
    result.
    """

    __slots__ = ("_change", "_interval", "_last_key", "_last_time", "_pending", "_first")

    def __init__(self, config: EmitConfig) -> None:
        self._change = config.mode == "change"
        self._interval = config.min_interval_s
        self._last_key: Any = None
        self._last_time = float("-inf")
        self._pending: Offered | None = None
        self._first = True

    def offer(self, frame: Frame, part: TaskResult, post_ms: float, detected: bool = True
              ) -> Offered | None:
        if self._change:
            key = part.change_key()
            if not (self._first or part.is_event() or key != self._last_key):
                if self._pending is None:
                    return None
                # nothing new; a held change may now be due
                return self._release_if_due(frame.ts)
        candidate = (frame, part, post_ms, detected)
        if frame.ts - self._last_time < self._interval:
            self._pending = candidate
            return None
        return self._take(candidate)

    def _release_if_due(self, now: float) -> Offered | None:
        if self._pending is not None and now - self._last_time >= self._interval:
            pending, self._pending = self._pending, None
            return self._take(pending)
        return None

    def _take(self, item: Offered) -> Offered:
        self._pending = None
        self._first = False
        self._last_key = item[1].change_key()
        self._last_time = item[0].ts
        return item

    def flush(self) -> Offered | None:
        pending, self._pending = self._pending, None
        return self._take(pending) if pending is not None else None
