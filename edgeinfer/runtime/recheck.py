"""Re-checking a backend decision while the model serves: when, and how.

A decision measured while other processes kept the CPUs busy (``Decision.under_load``, see
``busy.py``) is provisional: the multi-threaded candidates were slowed most, so the pick may be
the wrong one for a quiet box. ``RecheckPolicy`` says when to measure again (pure: it is fed the
time, the load and the live latency, so tests give it a fake clock):

- ``"idle"``: the decision is provisional and other processes have used less than
  ``idle_share`` of the CPUs for ``idle_for_s``;
- ``"drift"``: the live median latency of the serving choice has been over ``drift_ratio``
  times the measured median for ``drift_for_s`` (any decision);

never in the model's first ``after_s`` of serving, never while one runs, at most
``max_rechecks`` times, ``min_interval_s`` apart. How a re-check measures is
``select.recheck``'s (``remeasure.py``: the best few timed again; or every candidate measured
again when the busy boot did not reach them all); ``Model`` polls the watch from its run path
and switches sessions between two runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .busy import Load, LoadMeter, RecheckSettings

__all__ = ["POLL_S", "WINDOW", "RecheckPolicy", "Watch", "median"]

POLL_S = 5.0  # the policy is asked at most this often (the load read, the latency's median)
WINDOW = 512  # live latencies kept between two polls (the most recent)


def median(values: list[float]) -> float:
    """The median of a non-empty list (``statistics`` would cost this light module's import
    decimal and fractions)."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


class RecheckPolicy:
    """When a model's backend decision is measured again (see the module's docstring).

    ``tick(now, load, live_p50_ms)`` is called every few seconds with the load and the live
    median since the previous tick; it returns ``"idle"``, ``"drift"`` or None. The caller
    runs the re-check and then calls ``done(measured_ms, provisional)``.
    """

    def __init__(self, settings: RecheckSettings, *, started: float, measured_ms: float | None,
                 provisional: bool) -> None:
        self.settings = settings
        self.started = started
        self.measured_ms = measured_ms
        self.provisional = provisional
        self.count = 0
        self.running = False
        self.last_at: float | None = None
        self._prev: float = started  # the previous tick: the start of the readings' interval
        self._idle_since: float | None = None
        self._drift_since: float | None = None

    def tick(self, now: float, load: Load | None, live_p50_ms: float | None) -> str | None:
        """Take this interval's readings; the trigger when a re-check is due now."""
        s, prev, self._prev = self.settings, self._prev, now
        if load is not None and load.others < s.idle_share:
            self._idle_since = prev if self._idle_since is None else self._idle_since
        else:
            self._idle_since = None
        if live_p50_ms is not None and self.measured_ms \
                and live_p50_ms > s.drift_ratio * self.measured_ms:
            self._drift_since = prev if self._drift_since is None else self._drift_since
        else:
            self._drift_since = None
        if not s.enabled or self.running or self.count >= s.max_rechecks \
                or now - self.started < s.after_s \
                or (self.last_at is not None and now - self.last_at < s.min_interval_s):
            return None
        trigger = None
        if self.provisional and self._idle_since is not None \
                and now - self._idle_since >= s.idle_for_s:
            trigger = "idle"
        elif self._drift_since is not None and now - self._drift_since >= s.drift_for_s:
            trigger = "drift"
        if trigger is not None:
            self.running, self.last_at = True, now
            self.count += 1
            self._idle_since = self._drift_since = None
        return trigger

    def done(self, measured_ms: float | None, provisional: bool) -> None:
        """A re-check ended: what the serving choice measured (None: unchanged) and whether
        the decision is still provisional."""
        self.running = False
        if measured_ms is not None:
            self.measured_ms = measured_ms
        self.provisional = provisional


class Watch:
    """A serving model's live latency and its ``RecheckPolicy``, polled from the run path at
    most every ``poll_s`` (``record`` says when; the caller holds its own lock around it)."""

    def __init__(self, policy: RecheckPolicy, *, poll_s: float = POLL_S,
                 clock: Callable[[], float] = time.monotonic,
                 meter: LoadMeter | None = None) -> None:
        self.policy = policy
        self.poll_s = poll_s
        self.clock = clock
        self.meter = meter if meter is not None else LoadMeter()
        self._latencies: list[float] = []
        self._next = clock() + poll_s

    def record(self, ms: float) -> bool:
        """Add one run's latency; True when a poll is due (then call ``poll``)."""
        lat = self._latencies
        if len(lat) >= WINDOW:
            del lat[: WINDOW // 2]
        lat.append(ms)
        now = self.clock()
        if now < self._next:
            return False
        self._next = now + self.poll_s
        return True

    def poll(self) -> str | None:
        """The load and the live median since the last poll into the policy: its trigger."""
        lat, self._latencies = self._latencies, []
        p50 = median(lat) if lat else None
        return self.policy.tick(self.clock(), self.meter.read(), p50)
