"""Measuring a served decision's best candidates again (a re-check; when: ``recheck.py``).

The serving pick and the fastest correct ones of the decision's table (the fastest of each
thread count and backend among them, at most ``MAX_FINALISTS``) are opened afresh and timed
interleaved, in rotating rounds, until their ranking is stable or the re-check's budget ends.
A runner-up wins only when it is clearly faster: the serving choice's median at least
``switch_gain`` times its own, with a stable ranking. Correctness is not measured again: every
candidate timed here passed the gate against fp32 when the decision was made.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .base import Choice, Session, SessionSpec
from .busy import LoadMeter, RecheckSettings
from .decision import Decision, Row
from .feeds import measure_feeds
from .gate import Gate
from .timing import MAX_FINALISTS, TIE, finalists, pick, time_interleaved

__all__ = ["QUIET_TRIGGERS", "WHY", "Outcome", "recheck_choices", "remeasure"]

WHY = {"idle": "the load fell under idle_share", "drift": "live latency drifted",
       "quiet": "a load found the box quiet"}  # a re-check's trigger, in its note
QUIET_TRIGGERS = ("idle", "quiet")  # re-checks that count only when the box stays quiet


@dataclass(slots=True)
class Outcome:
    """What a re-check found: the updated decision, and the runner-up's open session when the
    model should switch to it (the caller owns it)."""

    decision: Decision
    session: Session | None
    stable: bool


def recheck_choices(decision: Decision) -> list[Choice]:
    """The candidates a re-check times: the serving pick and the fastest correct ones (the
    fastest of each thread count and backend among them), at most ``MAX_FINALISTS``."""
    rows = [r for r in decision.rows if r.status in ("ok", "picked")]
    chosen = [decision.choice]
    for r in finalists(rows, extra=True):
        if r.choice not in chosen:
            chosen.append(r.choice)
    return chosen[:MAX_FINALISTS]


def remeasure(spec: SessionSpec, decision: Decision, gate: Gate, *, trigger: str,
              settings: RecheckSettings, opener: Callable[[SessionSpec, Choice], Session],
              cancel: threading.Event | None = None,
              meter: LoadMeter | None = None, incumbent: bool = True) -> Outcome | None:
    """Time ``decision``'s best few again (interleaved, ``settings.budget_s``) and return the
    updated decision; None when there is nothing to compare (one correct candidate).

    ``incumbent``: the serving pick stays unless a runner-up is ``switch_gain`` times faster
    with a stable ranking (a model serving on it: a switch has a cost, and flapping between
    near-equals helps nobody). ``False`` (a load re-measuring a provisional decision, nothing
    served yet): the fastest wins (``pick``: a near-tie to the cheaper), as at a first boot.
    Either way a ``"idle"``/``"quiet"`` re-check that ran busy again keeps the pick.

    Raises:
        EdgeInferError: a candidate no longer opens or runs (the caller keeps serving).
    """
    choices = recheck_choices(decision)
    if len(choices) < 2:
        return None
    t0 = time.perf_counter()
    meter = meter or LoadMeter()
    opened: list[tuple[Row, Session]] = []
    keep: Session | None = None
    try:
        for c in choices:
            opened.append((Row(c, "ok"), opener(spec, c)))
        feeds, _ = measure_feeds(spec, gate, opened[0][1])
        if feeds is None:
            return None
        stable = time_interleaved(opened, feeds[0], t0 + settings.budget_s, cancel)
        timed = {r.choice: r for r, _ in opened}
        current, best = timed[decision.choice], pick(list(timed.values()))
        if incumbent:
            switch = stable and best is not None and best.choice != decision.choice \
                and (current.p50_ms or 0) >= settings.switch_gain * (best.p50_ms or float("inf"))
        else:
            switch = best is not None and best.choice != decision.choice
        load = meter.since_start()
        busy = trigger in QUIET_TRIGGERS and load is not None \
            and load.others >= settings.busy_share
        switch = switch and not busy  # the box got busy again: no better than the boot's
        winner = best if switch and best is not None else current
        updated = _updated(decision, timed, winner.choice)
        updated.elapsed_s = time.perf_counter() - t0
        updated.mark_load(load, settings.busy_share)
        updated.recheck_note = _note(trigger, current, best, switch, stable and not busy,
                                     updated)
        if switch:
            keep = next(s for r, s in opened if r.choice == winner.choice)
        return Outcome(updated, keep, stable)
    finally:
        for _, s in opened:
            if s is not keep:
                s.close()


def _updated(decision: Decision, timed: dict[Choice, Row], winner: Choice) -> Decision:
    rows: list[Row] = []
    for old in decision.rows:
        new = timed.get(old.choice)
        if new is not None:
            row = Row(old.choice, "ok", new.p50_ms, new.p99_ms, new.runs, old.load_ms, old.mib,
                      old.accuracy, old.reason, final=True)
        else:
            row = Row(old.choice, old.status, old.p50_ms, old.p99_ms, old.runs, old.load_ms,
                      old.mib, old.accuracy, old.reason, final=False)
            if row.status == "picked":
                row.status = "ok"
        if old.choice == winner:
            row.status = "picked"
        rows.append(row)
    return Decision(winner, rows, decision.gate, decision.inputs, decision.key,
                    created=time.time(), budget_s=decision.budget_s, note=decision.note,
                    rechecks=decision.rechecks + 1)


def _note(trigger: str, current: Row, best: Row | None, switch: bool, stable: bool,
          updated: Decision) -> str:
    why = WHY.get(trigger, trigger)
    if best is None or best.p50_ms is None or current.p50_ms is None:
        return f"re-checked ({why}): nothing timed"
    if switch:
        what = (f"switched from {current.choice.label()} ({current.p50_ms:.2f} ms) to "
                f"{best.choice.label()} ({best.p50_ms:.2f} ms)")
    elif best.choice == current.choice or current.p50_ms <= best.p50_ms * TIE:
        what = f"kept {current.choice.label()} ({current.p50_ms:.2f} ms, the fastest)"
    else:
        reason = "gain under the switch threshold" if stable else \
            "ranking not stable, or the box busy again"
        what = (f"kept {current.choice.label()} ({current.p50_ms:.2f} ms; "
                f"{best.choice.label()} {best.p50_ms:.2f} ms: {reason})")
    load = f", {updated.load.describe()}" if updated.load is not None else ""
    return f"re-checked ({why}{load}): {what}"
