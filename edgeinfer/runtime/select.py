"""``providers: auto`` by measuring: every way this device can run the model, timed and checked.

On a model's first load each candidate ``Choice`` (backend x precision x graph optimization x
threads up to the configured cap, see :func:`candidates`) is opened and run on fixed inputs: the
task's own sample inputs where the caller's ``Gate`` has them, else seeded random values. A
candidate whose outputs differ from the fp32 reference beyond the gate is rejected; so is one
over the memory limit; the fastest by median wins. Near-ties (within 3 %) go to the cheaper
candidate: fewer threads, no spinning, full precision. The decision and its table are cached in
the state directory under a key of the model's sha256, the backends' versions, the CPU and its
features and the options, so a later boot opens the winner directly.

Measuring has a time budget (``probe_budget_s``): candidates are tried most promising first, each
gets a slice, and the best three are timed again interleaved, in rotating rounds until their
pick is stable, so a noisy moment does not decide (the stopwatch and the ranking are
``timing.py``'s). The load is read meanwhile (``busy.py``): a decision measured while other
processes kept the CPUs busy is ``measured_under_load``, provisional, and re-checked later
while the model serves (``recheck.py``, ``remeasure.py``, driven by ``Model``).
Models that run in a fraction of a millisecond are measured on onnxruntime alone: switching
backend could save microseconds and compiling OpenVINO costs more than that gains.

Nothing falls back silently: candidates that failed or were refused stay in the table with the
reason, and a cached winner that no longer opens is measured again with a warning.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable

import numpy as np

from .._progress import say
from ..errors import EdgeInferError
from .backends import BackendModule, module
from .base import Choice, Fallback, Session, SessionSpec, warm_up
from .busy import LoadMeter
from .candidates import (
    admissible,
    backend_available,
    candidates,
    default_choice,
    reference_choice,
)
from .decision import (
    DEFAULT_BUDGET_S,
    Decision,
    Row,
    cache_key,
    forget,
    read_cached,
    store,
)
from .feeds import measure_feeds
from .gate import Gate, OutputsGate, compare_arrays
from .memory import MemoryMeter, trim_heap
from .remeasure import Outcome, remeasure
from .timing import (
    MIN_RUNS,
    TIE,
    Cancelled,
    keep_best,
    pick,
    pick_reason,
    time_finalists,
    time_runs,
)

logger = logging.getLogger(__name__)

SMALL_MS = 0.5  # below this per run, only onnxruntime candidates are measured
SAMPLE_S = 0.3  # per candidate's own timing for models under SMALL_MS (others: up to 1 s)
FINAL_SHARE = 0.25  # of the budget kept for timing the best few again, interleaved

Opener = Callable[[SessionSpec], Session]


def load_cached(spec: SessionSpec, gate_key: str) -> Decision | None:
    """The cached decision for ``spec`` under ``gate_key``, or None (none, unreadable, or a
    choice that could never have been a candidate for these options)."""
    found = read_cached(spec, gate_key)
    if found is None:
        return None
    decision, path = found
    why = admissible(spec, decision.choice)
    if why:  # edited by hand, or written for other options: never load what was not offered
        logger.warning("ignoring the backend decision %s: %s", path, why)
        return None
    return decision


def open_choice(spec: SessionSpec, choice: Choice, *, warmup: bool = False) -> Session:
    """Open exactly ``choice`` (no warm-up unless asked: measuring runs it anyway)."""
    backend: BackendModule = module(choice.backend)
    session: Session = backend.open_session(spec.replace(choice=choice, warmup=warmup,
                                                         probe=False))
    return session


def measure(
    spec: SessionSpec,
    gate: Gate | None = None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    opener: Callable[[SessionSpec, Choice], Session] | None = None,
    choices: Iterable[Choice] | None = None,
    keep_winner: bool = True,
    cancel: threading.Event | None = None,
    meter: LoadMeter | None = None,
    exclude: Collection[Choice] = (),
    finals: bool = True,
    on_step: Callable[[str, Choice | None], None] | None = None,
) -> tuple[Decision, Session | None]:
    """Measure the candidates and return the decision and, with ``keep_winner``, the winner's
    open session (the caller owns it). Never raises for a candidate's failure: each is a row.
    This runs the candidates in this process; :func:`edgeinfer.runtime.guarded.measure_guarded`
    runs this in a child, where a candidate that crashes is a refusal.

    ``exclude``: candidates not tried (no row: the caller adds its own). ``finals`` off: no
    interleaved timing of the best few. ``on_step(step, choice)`` is told before each step
    that runs a backend: ``"reference"``, ``"try"`` (``choice``), ``"final"`` (none).

    ``cancel`` set stops measuring between two candidates (and between two timed rounds):
    ``Cancelled`` is raised and every session opened here is closed. ``meter`` reads the
    load while measuring (default: ``/proc``); a decision measured while other processes used
    ``spec.recheck.busy_share`` of the CPUs or more is ``measured_under_load``, and then the
    fastest of each thread count and backend is timed among the finalists too.

    Raises:
        ModelLoadError: not even the reference configuration opens (the model is broken).
        Cancelled: ``cancel`` was set.
    """
    gate_: Gate = gate or OutputsGate()
    open_ = opener or (lambda s, c: open_choice(s, c))
    t0 = time.perf_counter()
    meter = meter or LoadMeter()  # other processes' share of the CPUs, from now to the decision
    # 5 % of the budget left for what follows measuring (opening and warming the winner), so
    # the whole load stays within it
    deadline = t0 + budget_s * 0.95
    step = on_step or _no_step
    ref_choice = reference_choice(spec)
    step("reference", ref_choice)
    ref = open_(spec, ref_choice)
    # Open sessions by choice: the reference and the current best few. Closed at the end, except
    # the winner's, which is handed to the caller.
    owned: dict[Choice, Session] = {ref_choice: ref}
    try:
        feeds, inputs_note = measure_feeds(spec, gate_, ref)
        if feeds is None:
            note = f"not measured: {inputs_note}"
            logger.warning("%s: backends %s; serving %s", spec.path.name, note,
                           default_choice(spec).label())
            choice = default_choice(spec)
            decision = Decision(choice, [Row(choice, "picked", reason=note)], gate_.key,
                                inputs_note, note=note)
            return _finish(decision, t0, budget_s, meter, spec), None
        reference = [ref.run(f) for f in feeds]
        gate_ = _calibrated(spec, gate_, open_, feeds, reference, exclude, step)
        step("reference", ref_choice)
        ref_row = Row(ref_choice, "ok", accuracy="reference")
        time_runs(ref, feeds[0], ref_row, MIN_RUNS, t0 + min(SAMPLE_S, budget_s / 10), cancel)
        small = ref_row.p50_ms is not None and ref_row.p50_ms < SMALL_MS
        cands, rows = candidates(spec, small=small)
        if choices is not None:
            cands = list(choices)
        rows.append(ref_row)
        say(logger, "%s: measuring %d backend candidates (at most %.0f s; the pick is cached)",
            spec.path.name, len(cands), budget_s)
        first_pass_end = t0 + budget_s * (1 - FINAL_SHARE)
        for i, choice in enumerate(cands):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"measuring {spec.path.name} was cancelled")
            if choice == ref_choice or choice in exclude:
                continue
            left = first_pass_end - time.perf_counter()
            if left <= 0:
                rows.append(Row(choice, "skipped", reason=f"probe budget {budget_s:g} s spent"))
                continue
            slice_s = min(SAMPLE_S if small else 1.0, 0.6 * left / max(1, len(cands) - i))
            step("try", choice)
            row, session = _try(spec, choice, open_, feeds, reference, gate_, slice_s, cancel)
            rows.append(row)
            if session is not None:
                owned[choice] = session
                keep_best(owned, rows, ref_choice)
        so_far = meter.since_start()  # busy: 2t candidates look slow; time each thread count
        step("final", None)
        stable = finals and time_finalists(
            spec, rows, owned, open_, feeds,
            min(deadline, time.perf_counter() + 4 * SAMPLE_S) if small else deadline, cancel,
            extra=so_far is not None and so_far.others >= spec.recheck.busy_share)
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"measuring {spec.path.name} was cancelled")
        note = "runs in under 0.5 ms: only onnxruntime measured" if small and choices is None \
            else ""
        winner = pick(rows)
        if winner is None:  # every candidate refused: the reference configuration is correct
            winner = ref_row
            note = "; ".join(filter(None, [note, "every candidate refused: serving the "
                                                 "reference configuration"]))
        winner.status = "picked"
        decision = Decision(winner.choice, rows, gate_.key, inputs_note, note=note)
        decision.stable = stable
        session = None
        if keep_winner:
            session = owned.pop(winner.choice, None) or open_(spec, winner.choice)
        return _finish(decision, t0, budget_s, meter, spec), session
    finally:
        for s in owned.values():
            s.close()
        trim_heap()


def _no_step(step: str, choice: Choice | None) -> None:
    pass


def _calibrated(spec: SessionSpec, gate: Gate, open_: Callable[[SessionSpec, Choice], Session],
                feeds: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]],
                exclude: Collection[Choice] = (),
                step: Callable[[str, Choice | None], None] = _no_step) -> Gate:
    """The gate with its tolerance widened to twice what two fp32 configurations disagree by
    (the reference and the default, both plain onnxruntime or LiteRT) on these inputs. Some
    models amplify rounding on made-up inputs (a text detector's sigmoid map: cosine 0.9975
    between two fp32 kernels on noise, equal masks on photos), and a quantized model's integer
    kernels differ from its float-simulated reference by quantization steps: neither is a fault
    the gate should refuse. A candidate worse than that still is."""
    calibrate = getattr(gate, "calibrate", None)
    if calibrate is None:
        return gate
    other = default_choice(spec)
    if other == reference_choice(spec) or other in exclude:
        return gate
    step("try", other)
    try:
        session = open_(spec, other)
    except Exception as exc:  # the candidate fails again later, with its reason in the table
        logger.debug("no second fp32 configuration for %s: %s", spec.path.name, exc)
        return gate
    try:
        outputs = [session.run(f) for f in feeds]
    except Exception as exc:
        logger.debug("no second fp32 configuration for %s: %s", spec.path.name, exc)
        return gate
    finally:
        session.close()
    calibrated: Gate = calibrate(reference, outputs)
    return calibrated


def _finish(decision: Decision, t0: float, budget_s: float, meter: LoadMeter,
            spec: SessionSpec) -> Decision:
    decision.elapsed_s = time.perf_counter() - t0
    decision.budget_s = budget_s
    decision.created = time.time()
    decision.mark_load(meter.since_start(), spec.recheck.busy_share)
    return decision



def _try(spec: SessionSpec, choice: Choice, open_: Callable[[SessionSpec, Choice], Session],
         feeds: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]],
         gate: Gate, slice_s: float, cancel: threading.Event | None = None
         ) -> tuple[Row, Session | None]:
    """Open, check and time one candidate; its session comes back open when it passed."""
    row = Row(choice)
    meter = MemoryMeter()
    t = time.perf_counter()
    try:
        session = open_(spec, choice)
    except Exception as exc:  # a backend's own exception classes too: never stop the others
        row.status, row.reason = "failed", _why(exc)
        return row, None
    row.load_ms = (time.perf_counter() - t) * 1000
    try:
        _check(session, choice, reference, feeds, row, gate, meter, spec)
        if row.status == "ok":
            time_runs(session, feeds[0], row, MIN_RUNS, time.perf_counter() + slice_s, cancel)
            return row, session
    except Cancelled:
        session.close()
        raise
    except Exception as exc:
        row.status, row.reason = "failed", _why(exc)
    session.close()
    return row, None


def _why(exc: BaseException) -> str:
    return _short(exc) if isinstance(exc, EdgeInferError) else \
        f"{type(exc).__name__}: {_short(exc)}"


def _check(session: Session, choice: Choice, reference: list[dict[str, np.ndarray]],
           feeds: list[dict[str, np.ndarray]], row: Row, gate: Gate, meter: MemoryMeter,
           spec: SessionSpec) -> None:
    try:
        outs = [session.run(f) for f in feeds]
    except Exception as exc:
        row.status, row.reason = "failed", _why(exc)
        return
    row.mib = meter.added_mb()
    why, row.accuracy = gate.compare(reference, outs)
    if why:
        row.status, row.reason = "rejected", why
        logger.info("%s: %s refused: %s", spec.path.name, choice.label(), why)
    elif spec.memory_limit_mb is not None and row.mib > spec.memory_limit_mb:
        row.status = "rejected"
        row.reason = f"{row.mib:.0f} MiB > memory_limit_mb {spec.memory_limit_mb:g}"
    else:
        row.status = "ok"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:240]


# -- re-checking a served decision (when: recheck.py; Model drives it) ---------------------------
def recheck(spec: SessionSpec, decision: Decision, gate: Gate, *, trigger: str,
            cancel: threading.Event | None = None,
            opener: Callable[[SessionSpec, Choice], Session] | None = None,
            meter: LoadMeter | None = None,
            measurer: Callable[..., tuple[Decision, Session | None]] | None = None
            ) -> Outcome | None:
    """Measure ``decision`` again while its pick serves: its best few timed again
    (``remeasure``), or, when the first measurement did not reach every candidate (its budget
    spent under load) or found fewer than two correct ones, every candidate measured and
    checked against fp32 again, as on a first boot (``probe_budget_s``; by ``measurer``, default
    ``measure``, as ``open_selected``). The runner-up wins
    only when it is ``switch_gain`` times faster than the serving pick, with a stable ranking,
    and (for an ``"idle"`` re-check) only when the box stayed under ``busy_share`` meanwhile.

    Raises:
        Cancelled: ``cancel`` was set.
        EdgeInferError: a candidate no longer opens or runs.
    """
    settings = spec.recheck
    open_ = opener or (lambda s, c: open_choice(s, c))
    correct = [r for r in decision.rows if r.status in ("ok", "picked")]
    unreached = [r for r in decision.rows if r.status == "skipped" and "budget" in r.reason]
    if len(correct) >= 2 and not unreached:
        return remeasure(spec, decision, gate, trigger=trigger, settings=settings,
                         opener=open_, cancel=cancel, meter=meter)
    fresh, session = (measurer or measure)(spec, gate, budget_s=spec.probe_budget_s,
                                           opener=open_, cancel=cancel, meter=meter)
    fresh.key, fresh.rechecks = decision.key, decision.rechecks + 1
    best = next((r for r in fresh.rows if r.status == "picked"), None)
    current = next((r for r in fresh.rows if r.choice == decision.choice
                    and r.status in ("ok", "picked") and r.p50_ms is not None), None)
    # an idle-triggered re-check that ran busy again is no better than the boot: no switch
    quiet = trigger != "idle" or not fresh.under_load
    switch = quiet and best is not None and best.choice != decision.choice and (
        current is None or (fresh.stable and (current.p50_ms or 0)
                            >= settings.switch_gain * (best.p50_ms or 0)))
    if not switch and current is not None and best is not None and best is not current:
        best.status, current.status, fresh.choice = "ok", "picked", decision.choice
    if not switch and session is not None:
        session.close()
        session = None
    if best is None or current is None:
        what = f"measured every candidate again: {fresh.choice.label()}"
    elif switch:
        what = (f"measured every candidate again: switched from {current.choice.label()} "
                f"({current.p50_ms:.2f} ms) to {best.choice.label()} ({best.p50_ms:.2f} ms)")
    else:
        why_kept = "" if fresh.stable and quiet else \
            " (ranking not stable, or the box busy again)"
        what = f"measured every candidate again: kept {current.choice.label()}{why_kept}"
    load = f", {fresh.load.describe()}" if fresh.load is not None else ""
    why = "the load fell under idle_share" if trigger == "idle" else "live latency drifted"
    fresh.recheck_note = f"re-checked ({why}{load}): {what}"
    return Outcome(fresh, session, fresh.stable)


# -- what load_model calls -----------------------------------------------------------------------
def open_selected(spec: SessionSpec, gate: Gate | None = None,
                  budget_s: float = DEFAULT_BUDGET_S, *,
                  measurer: Callable[..., tuple[Decision, Session | None]] | None = None
                  ) -> Session:
    """The session of the cached winner, or measure now, cache, and return the winner's.
    ``measurer``: ``measure`` or one with its signature (``guarded.measure_guarded`` runs it
    where a crash is a refusal; default ``measure``, in this process).

    Raises:
        ModelLoadError (and the backends' errors): the model opens nowhere.
    """
    gate_: Gate = gate or OutputsGate()
    cached = load_cached(spec, gate_.key)
    fallbacks: list[Fallback] = []
    if cached is not None:
        try:
            session = open_choice(spec, cached.choice, warmup=spec.warmup)
        except EdgeInferError as exc:
            logger.warning("the cached choice %s for %s no longer opens (%s): measuring again",
                           cached.choice.label(), spec.path.name, exc)
            fallbacks.append(Fallback(cached.choice.provider, f"cached choice failed: {exc}"))
            forget(spec, gate_.key)
        else:
            annotate_decision(session, cached)
            return session
    decision, measured = (measurer or measure)(spec, gate_, budget_s=budget_s)
    decision.key = cache_key(spec, gate_.key)
    store(spec, decision)
    if measured is None:  # not measurable: the default configuration
        session = open_choice(spec, decision.choice, warmup=spec.warmup)
    else:
        session = measured
        if spec.warmup:
            warm_up(session, spec)
    annotate_decision(session, decision)
    session.report.fallbacks.extend(fallbacks)
    say(logger, "%s: picked %s", spec.path.name, decision.summary())
    return session


def annotate_decision(session: Session, decision: Decision) -> None:
    """Write ``decision`` into ``session``'s load report (selection, summary, and a fallback
    for each provider asked for by name that cannot run here)."""
    report = session.report
    report.selection = decision.to_dict()
    report.selection["summary"] = decision.summary()
    picked = next((r for r in decision.rows if r.status == "picked"), None)
    # why the pick is not the fastest row of its own table, when it is not ("": it is)
    report.selection["why_picked"] = pick_reason(decision.rows, picked) if picked else ""
    known = {f.provider for f in report.fallbacks}
    for r in decision.rows:  # asked for by name and not runnable here: never silent
        if r.status == "skipped" and ("not available" in r.reason or "not installed" in r.reason) \
                and r.choice.provider not in known:
            report.fallbacks.append(Fallback(r.choice.provider, r.reason))
    if report.choice is None:
        session.report.choice = decision.choice


__all__ = ["TIE", "Cancelled", "Decision", "Gate", "OutputsGate", "Row", "annotate_decision",
           "backend_available",
           "cache_key", "candidates", "compare_arrays", "default_choice", "forget",
           "load_cached", "measure", "measure_feeds", "pick", "open_choice",
           "open_selected", "recheck", "reference_choice", "remeasure", "Outcome", "store"]
