"""The daemon's stall policy: when a running pipeline counts as stuck, how often it is rebuilt,
and when the daemon gives up so that systemd restarts it.

Not to be confused with `edgeinfer.health` (one pipeline's own state: running, waiting, ...):
this module judges pipelines from outside, over time, and decides what the daemon does.

A live pipeline that processes no frame for ``stall_s`` is rebuilt from its config, at most
``RESTART_BUDGET`` times in the restart window; then the watchdog pings stop and systemd kills
and restarts the daemon. `stall_policy` keeps the two consistent: the window always holds a full
budget of stalls, so a hung pipeline is escalated whatever ``WatchdogSec=`` is. A sensor source
(``mqtt``, ``serial``: `Source.paced_by_data`) may be quiet for hours: it stalls only when a
frame it yielded goes unhandled for ``stall_s``. A pipeline whose sinks fail every result for
``stall_s`` is rebuilt like a stuck one.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: `edgeinfer reload` imports this package and stays light
    from ..pipeline import Pipeline

__all__ = ["MIN_STALL_S", "RESTART_BUDGET", "RESTART_CLOSE_S", "RESTART_WINDOW_S",
           "StallWatch", "stall_policy"]

logger = logging.getLogger("edgeinfer.daemon")  # the name users filter on: kept from daemon.py

MIN_STALL_S = 10.0  # a live pipeline silent this long (or one watchdog interval) is stuck
RESTART_BUDGET = 5  # internal restarts of one stuck pipeline ...
RESTART_WINDOW_S = 60.0  # ... within at least this window, before the watchdog pings stop
RESTART_CLOSE_S = 5.0  # how long a stuck pipeline's stages get to finish when restarted


def stall_policy(watchdog_s: float | None, stall_s: float | None = None,
                 restart_budget: int = RESTART_BUDGET,
                 restart_window_s: float | None = None) -> tuple[float, float]:
    """The stall deadline and the restart window, made consistent.

    The deadline defaults to ``max(MIN_STALL_S, watchdog_s)``. The window defaults to room for
    the whole budget with slack: ``2 x budget x (stall_s + RESTART_CLOSE_S)``, at least
    ``RESTART_WINDOW_S``. A window shorter than ``budget x stall_s`` could never fill (one stall
    takes ``stall_s`` to notice), so the pipeline would be rebuilt forever and never escalated
    to the service manager: such a window is raised to that default.
    """
    stall = stall_s or max(MIN_STALL_S, watchdog_s or 0.0)
    needed = 2 * restart_budget * (stall + RESTART_CLOSE_S)
    window = max(RESTART_WINDOW_S, needed)
    if restart_window_s is not None and restart_window_s > restart_budget * stall:
        window = restart_window_s
    elif restart_window_s is not None:
        logger.warning("restart window %g s cannot hold %d stalls of %g s: using %g s",
                       restart_window_s, restart_budget, stall, window)
    return stall, window


class StallWatch:
    """Watches the running pipelines for stalls and failing sinks, and keeps the restart budget.

    The daemon calls `due` from its tick for each pipeline, and `admit` before rebuilding one;
    the rebuilding itself is the daemon's.

    Args:
        stall_s, restart_window_s: From `stall_policy`.
        restart_budget: Internal restarts allowed per pipeline and window.
    """

    def __init__(self, stall_s: float, restart_window_s: float,
                 restart_budget: int = RESTART_BUDGET) -> None:
        self.stall_s = stall_s
        self.restart_window_s = restart_window_s
        self.restart_budget = restart_budget
        self.restarts: dict[str, int] = {}  # internal restarts of stuck pipelines, per name
        self.stuck: str | None = None  # a pipeline whose restart budget is spent
        self._restart_times: dict[str, deque[float]] = {}
        self._progress: dict[str, tuple[Pipeline, int, float]] = {}  # processed, when it moved

    def due(self, p: Pipeline, now: float) -> str | None:
        """Why ``p`` must be rebuilt now, or ``None`` (also once a pipeline is stuck: then the
        service manager restarts the whole daemon)."""
        if self.stuck is not None:
            return None
        if self.stalled(p, now):
            return f"no frame processed for {self.stall_s:g} s"
        if self.sinks_failing(p, now) > self.stall_s and p.source.live and not p.paused \
                and not p.join(0):
            # a file pipeline would read its file again: it only shows as unhealthy
            return f"its sinks failed every result for {self.stall_s:g} s"
        return None

    def stalled(self, p: Pipeline, now: float) -> bool:
        """A live, unpaused, unfinished pipeline whose processed count has not moved for
        ``stall_s``. A file source that ended is not a stall, nor a camera that cannot be opened
        (unplugged: it retries with backoff and shows on stats; restarting the service would
        not bring it back), nor a quiet sensor: a source `paced_by_data` owes progress only
        while a frame it yielded is in flight, and any handling of a frame (processed, dropped
        by the task or the queue, skipped, failed) is progress. Nor a pipeline whose model
        worker crashes (``model_waiting``: a fresh worker is started with backoff, and its
        reason shown; rebuilding the pipeline or restarting the service would load the same
        model that crashes): each crash counts as progress, and the wait before a restart is
        no stall."""
        src, stats = p.source, p.stats
        n = stats.processed + stats.worker_restarts
        idle = False
        if getattr(src, "paced_by_data", False):
            n += stats.dropped_by_task + stats.dropped_queue + stats.errors + stats.paused
            idle = src.stats.frames <= n  # nothing yielded waits: a quiet sensor
        mark = self._progress.get(p.name)
        if not src.live or p.paused or p.join(0) or src.waiting or p.model_waiting or idle \
                or mark is None or mark[0] is not p or mark[1] != n:
            self._progress[p.name] = (p, n, now)
            return False
        return now - mark[2] > self.stall_s

    @staticmethod
    def sinks_failing(p: Pipeline, now: float) -> float:
        """How long a sink of ``p`` has failed every write (0.0: all working); such a pipeline
        is unhealthy, and is restarted like a stuck one when it lasts ``stall_s``."""
        since = [s.failing_since for s in p.sinks if s.failing_since]
        return now - min(since) if since else 0.0

    def admit(self, name: str, now: float, why: str) -> bool:
        """Count a restart of pipeline ``name`` (stuck for ``why``) against its budget: False
        when the budget is spent (then the pipeline is `stuck`)."""
        times = self._restart_times.setdefault(name, deque())
        while times and now - times[0] > self.restart_window_s:
            times.popleft()
        if len(times) >= self.restart_budget:
            self.give_up(name, f"{len(times)} restarts in {self.restart_window_s:.0f} s")
            return False
        times.append(now)
        self.restarts[name] = self.restarts.get(name, 0) + 1
        logger.warning("pipeline %s: %s; restarting it (%d of %d in %.0f s)", name, why,
                       len(times), self.restart_budget, self.restart_window_s)
        return True

    def give_up(self, name: str, why: str) -> None:
        """Mark ``name`` stuck: the watchdog pings stop."""
        self.stuck = name
        logger.error("pipeline %s is stuck (%s); watchdog pings stop so that the service "
                     "manager restarts the daemon", name, why)

    def restarted(self, name: str) -> None:
        """``name`` was rebuilt: its progress is measured afresh."""
        self._progress.pop(name, None)

    def renewed(self, name: str) -> None:
        """``name`` has a new config (a reload): a fresh restart budget."""
        self._restart_times.pop(name, None)
        if self.stuck == name:
            self.stuck = None
