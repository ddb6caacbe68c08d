"""Timing the selector's candidates: a session's runs sampled until a deadline, the best few
timed again interleaved, and the pick among the timed rows (a near-tie goes to the cheaper).

The stopwatch and the ranking only: which candidates there are, how their outputs are checked
and where the decision is kept is ``select.py``'s.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..errors import EdgeInferError
from .base import Choice, Session, SessionSpec
from .decision import Row

__all__ = ["BLOCK", "FINALISTS", "MAX_RUNS", "MIN_RUNS", "TIE", "Cancelled", "keep_best", "pick",
           "summarize", "time_finalists", "time_runs"]

logger = logging.getLogger("edgeinfer.runtime.select")  # its messages were select's: kept

TIE = 1.03  # within 3 % of the fastest, the cheaper candidate wins
MAX_RUNS = 2000  # a 10 us model gets 20 ms of samples, not 0.5 ms (noise decided before)
MIN_RUNS = 3
FINALISTS = 3
BLOCK = 6  # runs per finalist per interleaved round, the first untimed


class Cancelled(Exception):
    """Measuring was stopped (the model is being closed, the process is exiting)."""


def keep_best(owned: dict[Choice, Session], rows: Sequence[Row], ref_choice: Choice) -> None:
    """Close the sessions that are not among the best ``FINALISTS`` so far (the reference's
    stays: it is the fallback winner)."""
    timed = {r.choice: r.p50_ms for r in rows if r.status == "ok" and r.p50_ms is not None}
    best = sorted(timed, key=lambda c: timed[c] or math.inf)[:FINALISTS]
    for choice in [c for c in owned if c not in best and c != ref_choice]:
        owned.pop(choice).close()


def time_runs(session: Session, feeds: Mapping[str, np.ndarray], row: Row, min_runs: int,
              until: float, cancel: threading.Event | None = None) -> None:
    """Run ``session`` on ``feeds`` at least ``min_runs`` times and until ``until`` (a
    ``perf_counter``; ``MAX_RUNS`` at most), each run's milliseconds into ``row.samples``, then
    ``summarize(row)``.

    Raises:
        Cancelled: ``cancel`` was set.
    """
    session.run(feeds)  # one untimed run: caches, lazy allocations
    n = 0
    while n < min_runs or (time.perf_counter() < until and n < MAX_RUNS):
        # A closing model waits for this thread: a short script's close() must not wait out
        # the sample window (it took 0.3 s of every one-picture run).
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"measuring {row.choice.label()} was cancelled")
        t = time.perf_counter()
        session.run(feeds)
        row.samples.append((time.perf_counter() - t) * 1000)
        n += 1
    summarize(row)


def summarize(row: Row) -> None:
    """``row.runs``, ``p50_ms`` and ``p99_ms`` from its samples."""
    s = sorted(row.samples)
    row.runs = len(s)
    row.p50_ms = statistics.median(s)
    row.p99_ms = s[min(len(s) - 1, int(math.ceil(0.99 * len(s))) - 1)]


def time_finalists(spec: SessionSpec, rows: list[Row], owned: dict[Choice, Session],
                   open_: Callable[[SessionSpec, Choice], Session],
                   feeds: list[dict[str, np.ndarray]], deadline: float,
                   cancel: threading.Event | None = None) -> None:
    """Time the best few again, interleaved, replacing their numbers and marking them
    ``final`` (the pick is made among them): a noisy moment during one candidate's own slice
    must not decide. Each round runs every finalist for a block of ``BLOCK`` runs (the first
    untimed), as steady serving does: one run per switch let cache and thread-pool wake-ups
    decide (OpenVINO 2t over 1t: 1-5 % in single-run rounds, 15-18 % in steady runs)."""
    ok = sorted((r for r in rows if r.status == "ok" and r.p50_ms is not None),
                key=lambda r: r.p50_ms or math.inf)[:FINALISTS]
    if len(ok) < 2:
        return
    sessions: list[tuple[Row, Session]] = []
    try:
        for r in ok:
            s = owned.get(r.choice)
            if s is None:
                s = open_(spec, r.choice)
                owned[r.choice] = s
            s.run(feeds[0])
            sessions.append((r, s))
        rounds: list[list[float]] = [[] for _ in sessions]
        order = list(range(len(sessions)))
        n = 0
        last_round = 0.0  # a round that would end past the deadline is not started
        while n < MAX_RUNS and (n < 5 * BLOCK or time.perf_counter() + last_round < deadline) \
                and not (cancel is not None and cancel.is_set()):
            started = time.perf_counter()
            for i in order if (n // BLOCK) % 2 == 0 else order[::-1]:
                session = sessions[i][1]
                session.run(feeds[0])  # the switch's cost is not the candidate's
                for _ in range(BLOCK - 1):
                    t = time.perf_counter()
                    session.run(feeds[0])
                    rounds[i].append((time.perf_counter() - t) * 1000)
            n += BLOCK
            last_round = time.perf_counter() - started
        for (r, _), samples in zip(sessions, rounds):
            r.samples = samples
            r.final = True
            summarize(r)
    except EdgeInferError as exc:
        logger.warning("interleaved timing of %s stopped: %s", spec.path.name, exc)


def _cost(c: Choice) -> tuple[int, int, int, int]:
    return (c.threads, int(c.spin), int(c.precision != "fp32"), int(c.backend != "onnxruntime"))


def pick(rows: Sequence[Row]) -> Row | None:
    """The fastest correct row, among the finalists when they were timed (their numbers come
    from the same interleaved rounds; another row's come from its own, noisier slice)."""
    ok = [r for r in rows if r.status == "ok" and r.p50_ms is not None]
    if any(r.final for r in ok):
        ok = [r for r in ok if r.final]
    if not ok:
        return None
    best = min(r.p50_ms or math.inf for r in ok)
    near = [r for r in ok if (r.p50_ms or math.inf) <= best * TIE]
    return min(near, key=lambda r: (_cost(r.choice), r.p50_ms or math.inf))
