"""A provisional backend decision is measured again by the next load that finds the box quiet.

A decision measured while other processes kept the CPUs busy (``measured_under_load``, see
``busy.py``) may have picked what the load favoured (one thread where two win on a quiet box).
A long-lived model re-checks it after a quiet minute (``recheck.py``); a script or a CLI run
ends long before, so every later process would serve the busy boot's pick. Here a load of a
cached provisional decision:

1. opens the cached pick (warm-up included) and reads the load meanwhile, the same measure that
   marked it (other processes' share of our CPUs from ``/proc``), over ``QUIET_SAMPLE_S`` at
   least (it waits the rest when opening was quicker);
2. busy now (``recheck.busy_share`` or more): serves it as it is, saying so; nothing is measured,
   so a box that is always busy pays a quarter of a second per load, never a measurement (a
   short reading misjudges now and then: the measurement that follows reads the load again);
3. quiet: takes ``<state_dir>/select/<key>.lock`` (another process measuring it: serves the
   cached pick, naming that process), measures the decision's best few again interleaved
   (``remeasure``: the fastest wins, nothing is served yet), or every candidate when the busy
   boot's budget did not reach them all, and caches the result as final
   (``measured_under_load: false``), saying what it found;
4. busy again by the end of that measurement: the pick is kept, still provisional, and no load
   tries again for ``recheck.min_interval_s`` (``provisional_tried_at`` in the cache); the same
   when measuring fails (a candidate that no longer opens), the pick serving meanwhile.

``recheck: false`` (``RecheckSettings.enabled``) turns this off with the daemon's re-checks.
"""

from __future__ import annotations

import logging
import time

from .._progress import say
from ..errors import AlreadyRunningError, EdgeInferError, StorageError
from ..statelock import StateLock
from .base import Choice, Session, SessionSpec, warm_up
from .busy import Load, LoadMeter, read_times
from .decision import DEFAULT_BUDGET_S, Decision, cache_path, store
from .gate import Gate, OutputsGate
from .remeasure import remeasure
from .guarded import measure_guarded
from .select import annotate_decision, load_cached, measure, open_choice, open_selected

__all__ = ["QUIET_SAMPLE_S", "open_decided"]

logger = logging.getLogger(__name__)

QUIET_SAMPLE_S = 0.25  # the load is read over at least this long before a provisional pick serves


def open_decided(spec: SessionSpec, gate: Gate | None = None,
                 budget_s: float = DEFAULT_BUDGET_S) -> Session:
    """``select.open_selected``, except that a cached provisional decision is measured again
    when the box is quiet now (see the module's docstring).

    Raises:
        ModelLoadError (and the backends' errors): the model opens nowhere.
    """
    gate_: Gate = gate or OutputsGate()
    cached = load_cached(spec, gate_.key)
    if cached is None or not cached.under_load or not spec.recheck.enabled:
        return open_selected(spec, gate_, budget_s, measurer=measure_guarded)
    meter = LoadMeter(read_times)
    started = time.monotonic()
    try:
        session = open_choice(spec, cached.choice, warmup=spec.warmup)
    except EdgeInferError:  # it says why, forgets the decision and measures
        return open_selected(spec, gate_, budget_s, measurer=measure_guarded)
    try:
        return _confirm(spec, cached, gate_, session, _load_since(meter, started))
    except BaseException:
        session.close()
        raise


def _load_since(meter: LoadMeter, started: float) -> Load | None:
    rest = QUIET_SAMPLE_S - (time.monotonic() - started)
    if rest > 0:
        time.sleep(rest)
    return meter.since_start()


def _confirm(spec: SessionSpec, cached: Decision, gate: Gate, session: Session,
             load: Load | None) -> Session:
    settings = spec.recheck
    why_not = ""
    if load is None:
        why_not = "the load cannot be read here (no /proc)"
    elif load.others >= settings.busy_share:
        why_not = (f"the box is busy now too ({load.others * 100:.0f} %; quiet is under "
                   f"{settings.busy_share * 100:.0f} %)")
    elif cached.tried_at + settings.min_interval_s > time.time():
        why_not = (f"the last {cached.tries} tries ran into load; next try after "
                   f"{_clock(cached.tried_at + settings.min_interval_s)}")
    if why_not:
        return _serve(spec, session, cached, why_not)
    path = cache_path(spec, cached.key)
    assert path is not None  # a cached decision has a state directory
    lock = StateLock(path.with_suffix(".lock"),
                     what=f"re-measuring of {spec.path.name}'s backend decision")
    try:
        lock.acquire()
    except AlreadyRunningError:
        owner = StateLock.owner(lock.path)
        who = f"pid {owner['pid']}" if owner.get("pid") else "another process"
        return _serve(spec, session, cached, f"{who} is measuring it again")
    except StorageError as exc:
        return _serve(spec, session, cached, str(exc))
    try:
        latest = load_cached(spec, gate.key)  # another process may have just measured it
        if latest is not None and not latest.under_load:
            return _adopt(spec, session, cached.choice, latest, None)
        return _measure_again(spec, latest or cached, gate, session, cached.choice, load)
    finally:
        lock.release()


def _measure_again(spec: SessionSpec, cached: Decision, gate: Gate, session: Session,
                   serving: Choice, load: Load | None) -> Session:
    settings = spec.recheck
    correct = [r for r in cached.rows if r.status in ("ok", "picked")]
    unreached = [r for r in cached.rows if r.status == "skipped" and "budget" in r.reason]
    every = len(correct) < 2 or bool(unreached)
    quiet = f" ({load.describe()})" if load is not None else ""
    say(logger, "%s: the backend decision was %s; the box is quiet now%s: measuring %s again",
        spec.path.name, cached.load_note() or "provisional", quiet,
        "every candidate" if every else "its best candidates")
    meter = LoadMeter(read_times)
    fresh: Decision
    winner: Session | None
    try:
        if every:
            fresh, winner = measure(spec, gate, budget_s=spec.probe_budget_s, meter=meter)
        else:
            outcome = remeasure(spec, cached, gate, trigger="quiet", settings=settings,
                                opener=lambda s, c: open_choice(s, c), meter=meter,
                                incumbent=False)
            if outcome is None:  # nothing to compare after all: what was measured is all
                cached.under_load, cached.recheck_note = False, "one correct candidate: final"
                store(spec, cached)
                return _adopt(spec, session, serving, cached, None)
            fresh, winner = outcome.decision, outcome.session
    except Exception as exc:  # a candidate that no longer opens: the pick still serves
        logger.warning("%s: measuring the backend decision again failed (%s); serving %s",
                       spec.path.name, exc, serving.label())
        _tried(spec, cached)
        return _serve(spec, session, cached, f"measuring it again failed: {exc}")
    if every:
        fresh.key, fresh.rechecks = cached.key, cached.rechecks + 1
        old = cached.picked_row()
        fresh.recheck_note = (f"re-checked (a load found the box quiet"
                              f"{', ' + fresh.load.describe() if fresh.load else ''}): measured "
                              f"every candidate again: {fresh.choice.label()}"
                              f"{'' if old is None else ' (was ' + old.choice.label() + ')'}")
    if fresh.under_load:  # busy again meanwhile: no better than the boot's
        if winner is not None:
            winner.close()
        _tried(spec, cached)
        return _serve(spec, session, cached,
                      f"measured again, but the box got busy meanwhile "
                      f"({fresh.load.describe() if fresh.load else 'load unknown'}); next try "
                      f"after {_clock(cached.tried_at + settings.min_interval_s)}")
    store(spec, fresh)
    say(logger, "%s: %s; the decision is final", spec.path.name, fresh.recheck_note)
    return _adopt(spec, session, serving, fresh, winner)


def _tried(spec: SessionSpec, cached: Decision) -> None:
    """Count a try that did not end in a final decision: no load tries again for
    ``recheck.min_interval_s``."""
    cached.tries += 1
    cached.tried_at = time.time()
    store(spec, cached)


def _adopt(spec: SessionSpec, session: Session, serving: Choice, decision: Decision,
           winner: Session | None) -> Session:
    """Serve ``decision``: on ``session`` (open on ``serving``) when that is still the pick,
    else on ``winner`` (open, from the measurement) or the pick opened now."""
    if decision.choice != serving:
        if winner is None:
            winner = open_choice(spec, decision.choice, warmup=spec.warmup)
        elif spec.warmup:
            warm_up(winner, spec)
        session.close()
        session = winner
    elif winner is not None:
        winner.close()
    annotate_decision(session, decision)
    return session


def _serve(spec: SessionSpec, session: Session, cached: Decision, why: str) -> Session:
    """Serve the cached provisional pick, saying why it was not measured again."""
    logger.info("%s: serving the provisional backend decision %s, not measured again now: %s",
                spec.path.name, cached.choice.label(), why)
    annotate_decision(session, cached)
    selection = session.report.selection
    if selection is not None:
        selection["state"] = f"{selection['state']}; not measured again now: {why}"
    return session


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
