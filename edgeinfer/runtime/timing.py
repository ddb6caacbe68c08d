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

__all__ = ["BLOCK", "FINALISTS", "MAX_FINALISTS", "MAX_RUNS", "MIN_ROUNDS", "MIN_RUNS",
           "STABLE_ROUNDS", "TIE", "Cancelled", "finalists", "keep_best", "pick", "summarize",
           "time_finalists", "time_interleaved", "time_runs"]

logger = logging.getLogger("edgeinfer.runtime.select")  # its messages were select's: kept

TIE = 1.03  # within 3 % of the fastest, the cheaper candidate wins
MAX_RUNS = 2000  # a 10 us model gets 20 ms of samples, not 0.5 ms (noise decided before)
MIN_RUNS = 3
FINALISTS = 3
MAX_FINALISTS = 4  # with the best of each thread count and backend added under load
BLOCK = 6  # runs per finalist per interleaved round, the first untimed
MIN_ROUNDS = 5  # interleaved rounds before the ranking may be called stable
STABLE_ROUNDS = 4  # the same pick this many rounds in a row: stable


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


def finalists(rows: Sequence[Row], extra: bool = False) -> list[Row]:
    """The rows to time again together: the ``FINALISTS`` fastest correct ones; with ``extra``
    (the first pass ran under load, which slows multi-threaded candidates most) also the
    fastest of each thread count and of each backend not among them, up to ``MAX_FINALISTS``."""
    ok = sorted((r for r in rows if r.status in ("ok", "picked") and r.p50_ms is not None),
                key=lambda r: r.p50_ms or math.inf)
    out = ok[:FINALISTS]
    if extra:
        for field in ("threads", "backend"):
            seen = {getattr(r.choice, field) for r in out}
            for r in ok:
                if len(out) >= MAX_FINALISTS:
                    break
                if getattr(r.choice, field) not in seen:
                    out.append(r)
                    seen.add(getattr(r.choice, field))
    return out


def time_finalists(spec: SessionSpec, rows: list[Row], owned: dict[Choice, Session],
                   open_: Callable[[SessionSpec, Choice], Session],
                   feeds: list[dict[str, np.ndarray]], deadline: float,
                   cancel: threading.Event | None = None, *, extra: bool = False) -> bool:
    """Time the best few again, interleaved (``time_interleaved``), replacing their numbers
    and marking them ``final`` (the pick is made among them): a noisy moment during one
    candidate's own slice must not decide. Returns whether their ranking became stable."""
    ok = finalists(rows, extra)
    if len(ok) < 2:
        return True
    sessions: list[tuple[Row, Session]] = []
    try:
        for r in ok:
            s = owned.get(r.choice)
            if s is None:
                s = open_(spec, r.choice)
                owned[r.choice] = s
            sessions.append((r, s))
        return time_interleaved(sessions, feeds[0], deadline, cancel)
    except EdgeInferError as exc:
        logger.warning("interleaved timing of %s stopped: %s", spec.path.name, exc)
        return False


def time_interleaved(sessions: Sequence[tuple[Row, Session]], feeds: Mapping[str, np.ndarray],
                     deadline: float, cancel: threading.Event | None = None, *,
                     min_rounds: int = MIN_ROUNDS, stable_rounds: int = STABLE_ROUNDS) -> bool:
    """Time ``sessions`` in rounds (A B C, B C A, C A B...: the order rotates each round), each
    candidate a block of ``BLOCK`` runs per round (the first untimed: the switch's cost is not
    the candidate's), as steady serving runs (one run per switch let cache and thread-pool
    wake-ups decide: OpenVINO 2t over 1t 1-5 % in single-run rounds, 15-18 % in steady runs).

    After ``min_rounds`` it stops as soon as the pick among them (``pick``: the fastest median
    of all their samples, a near-tie to the cheaper) has been the same for ``stable_rounds``
    rounds in a row, else when the next round would end past ``deadline`` (or ``MAX_RUNS``).
    Each row's samples are replaced by its interleaved ones, marked ``final``. Returns whether
    the ranking was stable.

    Raises:
        EdgeInferError: a run failed (the rows keep their earlier numbers).
        Cancelled: ``cancel`` was set (the rows keep their earlier numbers).
    """
    for _, session in sessions:
        session.run(feeds)  # caches, lazy allocations: before any timed round
    samples: list[list[float]] = [[] for _ in sessions]
    trial = [Row(r.choice, "ok") for r, _ in sessions]
    n_rounds = streak = 0
    leader: Choice | None = None
    last_round = 0.0  # a round that would end past the deadline is not started
    while n_rounds * BLOCK < MAX_RUNS and \
            (n_rounds < min_rounds or time.perf_counter() + last_round < deadline):
        if cancel is not None and cancel.is_set():  # a closing model: no ranking to give
            raise Cancelled("interleaved timing was cancelled")
        started = time.perf_counter()
        k = n_rounds % len(sessions)
        for i in [*range(k, len(sessions)), *range(k)]:
            session = sessions[i][1]
            session.run(feeds)
            for _ in range(BLOCK - 1):
                t = time.perf_counter()
                session.run(feeds)
                samples[i].append((time.perf_counter() - t) * 1000)
        n_rounds += 1
        last_round = time.perf_counter() - started
        for row, got in zip(trial, samples):
            row.samples = got
            summarize(row)
        best = pick(trial)
        now = best.choice if best is not None else None
        streak = streak + 1 if now == leader else 1
        leader = now
        if n_rounds >= min_rounds and streak >= stable_rounds:
            break
    for (r, _), got in zip(sessions, samples):
        r.samples = got
        r.final = True
        summarize(r)
    return streak >= stable_rounds


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


_CHEAPER = ("fewer threads", "no spinning", "full precision", "onnxruntime (no compile)")


def pick_reason(rows: Sequence[Row], winner: Row) -> str:
    """Why ``winner`` is not the fastest correct row of the table ("" when it is): the
    faster row was not a finalist (its figure comes from its own slice), or it is within the
    ``TIE`` margin and the pick costs less, and how."""
    if winner.p50_ms is None:
        return ""
    faster = [r for r in rows if r is not winner and r.status in ("ok", "picked")
              and r.p50_ms is not None and r.p50_ms < winner.p50_ms]
    if not faster:
        return ""
    best = min(faster, key=lambda r: r.p50_ms or math.inf)
    share = 1 - (best.p50_ms or 0) / winner.p50_ms
    gain = f"{best.choice.label()} {best.p50_ms:.2f} ms was {share:.1%} faster"
    if winner.final and not best.final:
        return (f"not the fastest row: {gain} in its own slice, but not among the finalists "
                "timed again interleaved")
    ours, theirs = _cost(winner.choice), _cost(best.choice)
    how = next((w for w, a, b in zip(_CHEAPER, ours, theirs) if a < b), "cheaper")
    return (f"not the fastest row: {gain}, within the {TIE - 1:.0%} margin, and the pick is "
            f"cheaper ({how})")
