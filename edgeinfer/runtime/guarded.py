"""Measuring where a crash is a refusal: ``select.measure`` in a child process.

A backend candidate runs native code the selector has never run on this model: OpenVINO, LiteRT
delegates, a plug-in. One that segfaults or aborts while opened, checked or timed would take the
whole process with it, and a daemon measuring a new model (a boot, an OTA update, a second
pipeline) would crash-loop. :func:`measure_guarded` therefore measures in
``python -m edgeinfer.runtime.guarded``: the child tells the parent each step before it runs
it (the reference, each candidate, the interleaved timing of the best few), and sends the
decision back. When the child dies, the step it was in says what killed it:

- a candidate: refused (``crashed (SIGSEGV) while measured``) and the measuring starts again
  without it, up to ``MAX_CRASHES`` times;
- the interleaved timing: measured again without it (the first pass's numbers decide);
- the reference configuration (the format's own backend, fp32): the model cannot be run here,
  ``ModelLoadError``.

A child that sends nothing for ``budget_s`` plus a margin is killed and its step treated the
same way (``hung``). The winner is then opened in the calling process (through the caller's
opener, so a memory budget charges it); the child's sessions were its own.

The gate stays in the caller: a task's gate holds the task and its model, which do not travel.
The child asks for the sample inputs and sends each candidate's outputs to be judged
(``_RemoteGate``), so the photos are preprocessed and the detections compared exactly as when
measuring in one process.

Measured in this process instead (said at debug level): a spec that cannot be pickled, a
caller's own ``meter``, or ``EDGEINFER_MEASURE_IN_PROCESS=1`` (a backend under a debugger).
"""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from .._child import Forward, describe_exit, die_with_parent, emit_record, spawn, wait_exit
from ..errors import ModelLoadError
from . import backends
from .base import Choice, Session, SessionSpec, TensorSpec
from .busy import LoadMeter
from .decision import DEFAULT_BUDGET_S, Decision, Row
from .gate import Gate, OutputsGate
from .select import measure, open_choice
from .timing import Cancelled

__all__ = ["MAX_CRASHES", "measure_guarded"]

logger = logging.getLogger(__name__)

MAX_CRASHES = 4  # candidates refused for crashing before the model is refused altogether
_MARGIN_S = 60.0  # beyond the budget: the child's imports, opening the reference, a slow box
_POLL_S = 0.2  # how often the parent looks at ``cancel`` while the child measures

Opener = Callable[[SessionSpec, Choice], Session]


def measure_guarded(
    spec: SessionSpec,
    gate: Gate | None = None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    opener: Opener | None = None,
    choices: Iterable[Choice] | None = None,
    keep_winner: bool = True,
    cancel: threading.Event | None = None,
    meter: LoadMeter | None = None,
) -> tuple[Decision, Session | None]:
    """``select.measure`` (same arguments, same result) with the candidates run in a child
    process: a candidate that crashes it is a refused row, not a dead caller.

    Raises:
        ModelLoadError: the reference configuration crashed or hung the child, more than
            ``MAX_CRASHES`` candidates did, or the child failed otherwise (its reason).
        Cancelled: ``cancel`` was set (the child is killed).
    """
    gate_: Gate = gate or OutputsGate()
    open_ = opener or open_choice
    chosen = list(choices) if choices is not None else None
    why_here = _in_process_reason(spec, gate_, meter)
    if why_here:
        logger.debug("measuring %s in this process: %s", spec.path.name, why_here)
        return measure(spec, gate_, budget_s=budget_s, opener=opener, choices=chosen,
                       keep_winner=keep_winner, cancel=cancel, meter=meter)
    crashed: list[Row] = []
    finals_lost = ""  # how the interleaved timing of the best few ended the child, if it did
    while True:
        outcome = _run_child(spec, gate_, budget_s, chosen, [r.choice for r in crashed],
                             not finals_lost, cancel)
        if isinstance(outcome, Decision):
            break
        step, choice, how = outcome
        if step == "start":  # before any backend ran: the child itself (its stderr says why)
            raise ModelLoadError(f"{spec.path.name}: the process that measures backends {how} "
                                 "before measuring (its error is in the log above)")
        if step == "final" and not finals_lost:
            logger.warning("%s: the interleaved timing of the best candidates %s; measuring "
                           "again without it", spec.path.name, how)
            finals_lost = how
            continue
        if step != "try" or choice is None:
            what = (f"its reference configuration ({_label(choice)}, the format's own backend "
                    "in fp32)" if step == "reference" else "picking among the candidates")
            raise ModelLoadError(
                f"{spec.path.name}: the process measuring it {how} in {what}: the model cannot "
                "be run here (try another export of it, or another version of the backend)")
        logger.warning("%s: backend candidate %s %s while measured: refused", spec.path.name,
                       choice.label(), how)
        crashed.append(Row(choice, "rejected", reason=f"{how} while measured"))
        if len(crashed) > MAX_CRASHES:
            raise ModelLoadError(
                f"{spec.path.name}: {len(crashed)} backend candidates crashed while measured ("
                + ", ".join(f"{r.choice.label()}: {r.reason}" for r in crashed)
                + "): name a backend that runs it (providers: onnxruntime)")
    decision = outcome
    decision.rows.extend(crashed)
    if finals_lost:
        decision.note = "; ".join(filter(None, [decision.note, f"the interleaved timing "
                                                f"{finals_lost}: picked on the first pass"]))
    if not keep_winner or decision.note.startswith("not measured"):
        return decision, None
    return decision, open_(spec, decision.choice)


def _in_process_reason(spec: SessionSpec, gate: Gate, meter: LoadMeter | None) -> str:
    if os.environ.get("EDGEINFER_MEASURE_IN_PROCESS", "") not in ("", "0"):
        return "EDGEINFER_MEASURE_IN_PROCESS is set"
    if meter is not None:
        return "the caller reads the load itself"
    try:
        pickle.dumps(spec)
    except Exception as exc:  # pickle raises several kinds for what it cannot send
        return f"its spec cannot be sent to a child ({type(exc).__name__}: {exc})"
    return ""


class _RemoteGate:
    """The caller's gate, asked over the connection (see the module's docstring)."""

    def __init__(self, conn: Connection, lock: threading.Lock, key: str, samples: str) -> None:
        self._conn = conn
        self._lock = lock
        self._key = key
        self.samples = samples

    @property
    def key(self) -> str:
        return self._key

    def _ask(self, method: str, *args: Any) -> Any:
        with self._lock:
            self._conn.send_bytes(pickle.dumps(("gate", method, args)))
        kind, value = pickle.loads(self._conn.recv_bytes())
        if kind == "raise":
            raise value
        return value

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        feeds: list[dict[str, np.ndarray]] = self._ask("sample_feeds", tuple(inputs))
        return feeds

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]:
        verdict: tuple[str, str] = self._ask("compare", list(reference), list(outputs))
        return verdict


class _RemoteCalibratingGate(_RemoteGate):
    """A remote gate whose caller's gate calibrates (``select._calibrated``)."""

    def calibrate(self, reference: Sequence[Mapping[str, np.ndarray]],
                  other: Sequence[Mapping[str, np.ndarray]]) -> _RemoteCalibratingGate:
        self._ask("calibrate", list(reference), list(other))
        return self


def _answer(gate: Gate, method: str, args: tuple[Any, ...]) -> tuple[Gate, tuple[str, Any]]:
    """The caller's side of ``_RemoteGate._ask``: the gate (a calibrated one replaces it) and
    the reply."""
    try:
        if method == "sample_feeds":
            return gate, ("value", gate.sample_feeds(*args))
        if method == "compare":
            return gate, ("value", gate.compare(*args))
        if method == "calibrate":
            calibrated: Gate = gate.calibrate(*args)  # type: ignore[attr-defined]
            return calibrated, ("value", None)
        return gate, ("raise", ModelLoadError(f"the measuring child asked for {method!r}"))
    except Exception as exc:  # raised in the child, where measure expects it
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # an exception class that does not survive pickling
            exc = ModelLoadError(f"the accuracy gate failed: {type(exc).__name__}: {exc}")
        return gate, ("raise", exc)


def _label(choice: Choice | None) -> str:
    return choice.label() if choice is not None else "?"


Outcome = Decision | tuple[str, Choice | None, str]


def _run_child(spec: SessionSpec, gate: Gate, budget_s: float, choices: list[Choice] | None,
               exclude: list[Choice], finals: bool, cancel: threading.Event | None) -> Outcome:
    """The child's decision, or ``(step, choice, how)`` for the step it died or hung in.

    Raises:
        ModelLoadError: the child raised (its message) or could not be started.
        Cancelled: ``cancel`` was set.
    """
    request = {"spec": spec, "gate": (gate.key, str(getattr(gate, "samples", "sample inputs")),
                                      callable(getattr(gate, "calibrate", None))),
               "budget_s": budget_s, "choices": choices,
               "exclude": exclude, "finals": finals, "backends": dict(backends.BACKENDS),
               "log_level": logging.getLogger("edgeinfer").getEffectiveLevel()}
    try:
        proc, conn = spawn("edgeinfer.runtime.guarded")
    except OSError as exc:
        raise ModelLoadError(f"{spec.path.name}: cannot start the process that measures "
                             f"backends: {exc}") from exc
    step: tuple[str, Choice | None] = ("start", None)
    deadline = time.monotonic() + budget_s + _MARGIN_S
    answer: Decision | BaseException | None = None
    try:
        # the path first: the request may hold a plug-in backend's options (its module's class)
        conn.send_bytes(pickle.dumps(list(sys.path)))
        conn.send_bytes(pickle.dumps(request))
        while answer is None:
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"measuring {spec.path.name} was cancelled")
            if time.monotonic() > deadline:
                return (step[0], step[1], f"hung (no answer within {budget_s + _MARGIN_S:.0f} s)")
            if not conn.poll(_POLL_S):
                continue
            message = pickle.loads(conn.recv_bytes())
            if message[0] == "step":
                step = (message[1], message[2])
            elif message[0] == "log":
                emit_record(message[1])
            elif message[0] == "gate":
                gate, reply = _answer(gate, message[1], message[2])
                conn.send_bytes(pickle.dumps(reply))
            else:  # "done": the decision; "error": what measure raised there
                answer = message[1]
    except (EOFError, OSError):
        pass  # the child is gone: how, below
    finally:
        conn.close()
        if answer is None and proc.poll() is None:  # cancelled or hung: not waited on
            proc.kill()
        code = wait_exit(proc)
    if isinstance(answer, Decision):
        return answer
    if isinstance(answer, BaseException):
        raise answer
    return (step[0], step[1], describe_exit(code))


def _child(fd: int) -> int:
    die_with_parent()
    conn = Connection(fd)
    # the parent's path: a plug-in backend's module imports here as it does there
    for entry in pickle.loads(conn.recv_bytes()):
        if entry not in sys.path:
            sys.path.append(entry)
    request: dict[str, Any] = pickle.loads(conn.recv_bytes())
    lock = threading.Lock()  # a backend's own thread may log while the measuring sends
    root = logging.getLogger()
    root.handlers[:] = [Forward(conn, lock)]
    logging.getLogger("edgeinfer").setLevel(request["log_level"])
    backends.BACKENDS.update(request["backends"])

    def step(name: str, choice: Choice | None) -> None:
        with lock:
            conn.send_bytes(pickle.dumps(("step", name, choice)))

    key, samples, calibrates = request["gate"]
    gate = (_RemoteCalibratingGate if calibrates else _RemoteGate)(conn, lock, key, samples)
    try:
        decision, _ = measure(request["spec"], gate, budget_s=request["budget_s"],
                              choices=request["choices"], keep_winner=False,
                              exclude=request["exclude"], finals=request["finals"],
                              on_step=step)
    except Exception as exc:  # raised in the parent as it is, or as what it says
        try:
            sent = pickle.dumps(("error", exc))
            pickle.loads(sent)
        except Exception:  # an exception class that does not survive pickling
            sent = pickle.dumps(("error", ModelLoadError(
                f"{request['spec'].path.name}: measuring the backends failed: "
                f"{type(exc).__name__}: {exc}")))
        conn.send_bytes(sent)
        return 1
    conn.send_bytes(pickle.dumps(("done", decision)))
    return 0


if __name__ == "__main__":  # pragma: no cover - the child's entry point
    sys.exit(_child(int(sys.argv[1])))
