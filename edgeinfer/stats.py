"""Counters and latency windows a pipeline keeps, cheap to update per frame, summarized on
request (the stats topic, ``STATUS=``, the end-of-run summary)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class LatencyWindow:
    """The last ``size`` samples in a ring buffer; percentiles computed only when asked."""

    __slots__ = ("_buf", "_n", "last")

    def __init__(self, size: int = 512) -> None:
        self._buf = np.zeros(size, dtype=np.float64)
        self._n = 0
        self.last = 0.0

    def add(self, value: float) -> None:
        self._buf[self._n % len(self._buf)] = value
        self._n += 1
        self.last = value

    @property
    def count(self) -> int:
        return self._n

    def histogram(self, edges: list[float]) -> list[int]:
        """How many of the window's samples fall in each bin ``[edges[i], edges[i+1])``; the
        last bin also takes everything above the last edge (``len(edges)`` counts)."""
        n = min(self._n, len(self._buf))
        at = np.searchsorted(np.asarray(edges, dtype=np.float64), self._buf[:n], side="right")
        counts = np.bincount(np.clip(at - 1, 0, len(edges) - 1), minlength=len(edges))
        return [int(c) for c in counts]

    def summary(self) -> dict[str, float]:
        n = min(self._n, len(self._buf))
        if not n:
            return {"p50": 0.0, "p99": 0.0, "mean": 0.0}
        window = self._buf[:n]
        p50, p99 = np.percentile(window, [50, 99])
        return {"p50": round(float(p50), 3), "p99": round(float(p99), 3),
                "mean": round(float(window.mean()), 3)}


class RecentRate:
    """Events per second over the last ``window_s`` whole seconds: one counter per second in a
    ring, so counting an event is an index and an add (the per-frame path) and the rate is
    summed only when asked. A stream that stopped (paused, camera lost) reads 0 within
    ``window_s``, where an average since start would go on showing its old speed."""

    __slots__ = ("_counts", "_secs")

    def __init__(self, window_s: int = 5) -> None:
        self._counts = [0] * (window_s + 1)  # one more: the second in progress is not summed
        self._secs = [-1] * (window_s + 1)

    def add(self, now: float) -> None:
        sec = int(now)
        i = sec % len(self._counts)
        if self._secs[i] != sec:
            self._secs[i] = sec
            self._counts[i] = 0
        self._counts[i] += 1

    def rate(self, now: float, since: float) -> float | None:
        """Per second over the whole seconds before ``now`` (and after ``since``, the start);
        ``None`` before one whole second has passed."""
        sec = int(now)
        span = min(len(self._counts) - 1, sec - int(since))
        if span <= 0:
            return None
        total = sum(c for s, c in zip(self._secs, self._counts) if sec - span <= s < sec)
        return total / span


@dataclass(slots=True)
class PipelineStats:
    """What one pipeline did. Stage threads write their own fields; readers take snapshots."""

    frames_in: int = 0  # frames queued for the model (preprocessed) or past it (gated)
    processed: int = 0  # frames through to the emit stage (with the model, or gated past it)
    detected: int = 0  # frames the model ran on (``detect:`` gating skips the others)
    skipped_by_gate: int = 0  # frames the detection gate kept from the model
    emitted: int = 0  # results delivered to sinks
    dropped_queue: int = 0  # live frames dropped because inference fell behind
    dropped_by_task: int = 0  # frames a stage dropped on purpose (DropFrame)
    paused: int = 0  # frames skipped while paused or over a tuned max_fps
    errors: int = 0  # inference failures (the frame is skipped)
    sink_errors: int = 0
    events: int = 0  # scene analytics events made
    worker_restarts: int = 0
    last_error: str = ""
    pre: LatencyWindow = field(default_factory=LatencyWindow)
    infer: LatencyWindow = field(default_factory=LatencyWindow)
    wait: LatencyWindow = field(default_factory=LatencyWindow)  # for a model other pipelines share
    post: LatencyWindow = field(default_factory=LatencyWindow)
    latency: LatencyWindow = field(default_factory=LatencyWindow)  # capture -> emitted
    recent: RecentRate = field(default_factory=RecentRate)  # processed frames, per second
    started: float = 0.0
    stopped: float = 0.0
    _fps_mark: tuple[float, int] = (0.0, 0)

    def start(self) -> None:
        self.started = time.monotonic()
        self._fps_mark = (self.started, 0)

    def stop(self) -> None:
        self.stopped = time.monotonic()

    def fps(self) -> float:
        """Frames processed per second since the last call (or since start)."""
        now = time.monotonic() if not self.stopped else self.stopped
        then, count = self._fps_mark
        self._fps_mark = (now, self.processed)
        return (self.processed - count) / (now - then) if now > then else 0.0

    def overall_fps(self) -> float:
        end = self.stopped or time.monotonic()
        return self.processed / (end - self.started) if end > self.started else 0.0

    def recent_fps(self) -> float:
        """Frames processed per second over the last few seconds (the whole run's average once
        stopped, or in its first second)."""
        if self.stopped or not self.started:
            return self.overall_fps()
        now = time.monotonic()
        rate = self.recent.rate(now, self.started)
        return self.overall_fps() if rate is None else rate

    def snapshot(self, running: bool = True) -> dict[str, Any]:
        """The counters; ``fps`` is the recent rate (0 unless ``running``: a paused pipeline
        or one without its source makes no frames), ``fps_overall`` the run's average."""
        return {
            "frames_in": self.frames_in,
            "processed": self.processed,
            "emitted": self.emitted,
            "dropped": {"queue": self.dropped_queue, "task": self.dropped_by_task,
                        "paused": self.paused},
            "errors": self.errors,
            "sink_errors": self.sink_errors,
            "events": self.events,
            "worker_restarts": self.worker_restarts,
            "detect": {"frames": self.detected, "skipped": self.skipped_by_gate},
            "last_error": self.last_error,
            "fps": round(self.recent_fps(), 2) if running or self.stopped else 0.0,
            "fps_overall": round(self.overall_fps(), 2),
            "latency_ms": {"pre": self.pre.summary(), "infer": self.infer.summary(),
                           "wait": self.wait.summary(), "post": self.post.summary(),
                           "end_to_end": self.latency.summary()},
        }
