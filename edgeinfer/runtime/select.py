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
gets a slice, and the best three are timed again interleaved so a noisy moment does not decide.
Models that run in a fraction of a millisecond are measured on onnxruntime alone: switching
backend could save microseconds and compiling OpenVINO costs more than that gains.

Nothing falls back silently: candidates that failed or were refused stay in the table with the
reason, and a cached winner that no longer opens is measured again with a warning.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .._importer import resolve
from ..errors import EdgeInferError, InvalidInputError
from .base import Choice, Fallback, Session, SessionSpec, TensorSpec, warmup_feeds
from .memory import MemoryMeter, trim_heap
from .providers import CPU, cpu_features, cpu_features_digest, detect_platform, rank_providers

logger = logging.getLogger(__name__)

SELECTOR_VERSION = 1
DEFAULT_BUDGET_S = 15.0
TIE = 1.03  # within 3 % of the fastest, the cheaper candidate wins
SMALL_MS = 0.5  # below this per run, only onnxruntime candidates are measured
MAX_RUNS = 50
MIN_RUNS = 3
FINALISTS = 3

BACKENDS = {
    "onnxruntime": "edgeinfer.runtime.onnx:open_session",
    "openvino": "edgeinfer.runtime.openvino:open_session",
    "litert": "edgeinfer.runtime.tflite:open_session",
    "armnn": "edgeinfer.runtime.armnn:open_session",
}
# Backends other than onnxruntime: module, the distribution whose version keys the cache.
_OPTIONAL = {"openvino": ("edgeinfer.runtime.openvino", "openvino"),
             "armnn": ("edgeinfer.runtime.armnn", "pyarmnn")}
_BACKEND_NAMES = {"openvino": "openvino", "OpenVINOExecutionProvider": "openvino",
                  "litert": "litert", "armnn": "armnn"}


# -- gates ------------------------------------------------------------------------------------------
class Gate(Protocol):
    """Decides whether a candidate's outputs are the reference's, for one kind of task.

    ``key`` names the gate in the decision cache. ``sample_feeds`` gives real inputs for the
    model (preprocessed sample photos for a detector); an empty list means made-up inputs.
    ``compare`` returns ``(why rejected or "", a short accuracy note)``.
    """

    @property
    def key(self) -> str: ...

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]: ...

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]: ...


@dataclass(frozen=True, slots=True)
class OutputsGate:
    """Every output close to the reference: cosine >= ``cosine`` and the largest error at most
    ``rel_range`` of the reference's value range (float outputs); integer and boolean outputs
    equal; shapes equal. The gate for models whose task is not known."""

    cosine: float = 0.9999
    rel_range: float = 1e-3
    key: str = "outputs"

    def sample_feeds(self, inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        return []

    def compare(self, reference: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[Mapping[str, np.ndarray]]) -> tuple[str, str]:
        worst_cos, worst_rel = 1.0, 0.0
        for ref, got in zip(reference, outputs):
            for name, r in ref.items():
                why, cos, rel = compare_arrays(name, r, got.get(name), self.cosine, self.rel_range)
                if why:
                    return why, f"cosine {cos:.6f}, error/range {rel:.2g}"
                worst_cos, worst_rel = min(worst_cos, cos), max(worst_rel, rel)
        return "", f"cosine {worst_cos:.6f}, error/range {worst_rel:.2g}"


def compare_arrays(name: str, ref: np.ndarray, got: Any, min_cosine: float,
                   max_rel: float) -> tuple[str, float, float]:
    """``(why it fails or "", cosine, max error relative to the reference's range)``."""
    if not isinstance(got, np.ndarray):
        return f"output {name!r} missing", 0.0, math.inf
    r = np.asarray(ref)
    if got.shape != r.shape:
        return f"output {name!r} has shape {got.shape}, the reference {r.shape}", 0.0, math.inf
    if r.dtype.kind not in "fc":
        if r.dtype.kind == "O" or got.dtype.kind == "O":
            same = bool(np.array_equal(r.astype(str), got.astype(str)))
        else:
            same = bool(np.array_equal(r, got))
        return ("" if same else f"output {name!r} differs from the reference"), \
            (1.0 if same else 0.0), (0.0 if same else math.inf)
    if r.size == 0:
        return "", 1.0, 0.0
    a = np.asarray(r, dtype=np.float64).ravel()
    b = np.asarray(got, dtype=np.float64).ravel()
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite]):
        return f"output {name!r} has NaN/inf where the reference has not", 0.0, math.inf
    a, b = a[finite], b[finite]
    if a.size == 0:
        return "", 1.0, 0.0
    err = float(np.max(np.abs(a - b)))
    span = float(np.max(a) - np.min(a))
    rel = err / span if span > 0 else (0.0 if err == 0 else err / max(float(np.max(np.abs(a))),
                                                                       1e-12))
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 and nb == 0:
        cos = 1.0
    elif na == 0 or nb == 0:
        cos = 0.0
    else:
        cos = float(np.dot(a, b) / (na * nb))
    if cos < min_cosine:
        return f"output {name!r}: cosine {cos:.6f} < {min_cosine}", cos, rel
    if rel > max_rel:
        return f"output {name!r}: max error {err:.3g} is {rel:.2g} of its range (> {max_rel:g})", \
            cos, rel
    return "", cos, rel


# -- the table -----------------------------------------------------------------------------------
@dataclass(slots=True)
class Row:
    """One candidate's line in the table."""

    choice: Choice
    status: str = "skipped"  # "picked" | "ok" | "rejected" | "failed" | "skipped"
    p50_ms: float | None = None
    p99_ms: float | None = None
    runs: int = 0
    load_ms: float | None = None
    mib: float | None = None
    accuracy: str = ""
    reason: str = ""
    samples: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"choice": self.choice.to_dict(), "label": self.choice.label(),
                "status": self.status, "p50_ms": _r(self.p50_ms), "p99_ms": _r(self.p99_ms),
                "runs": self.runs, "load_ms": _r(self.load_ms), "mib": _r(self.mib),
                "accuracy": self.accuracy, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Row:
        return cls(Choice.from_dict(d["choice"]), str(d.get("status", "")), d.get("p50_ms"),
                   d.get("p99_ms"), int(d.get("runs") or 0), d.get("load_ms"), d.get("mib"),
                   str(d.get("accuracy", "")), str(d.get("reason", "")))


@dataclass(slots=True)
class Decision:
    """The winner and the whole table, as cached and as ``edgeinfer info`` shows it."""

    choice: Choice
    rows: list[Row]
    gate: str
    inputs: str
    key: str = ""
    created: float = 0.0
    elapsed_s: float = 0.0
    budget_s: float = DEFAULT_BUDGET_S
    cached: bool = False
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"version": SELECTOR_VERSION, "choice": self.choice.to_dict(),
                "picked": self.choice.label(), "provider": self.choice.provider,
                "gate": self.gate, "inputs": self.inputs, "key": self.key,
                "created": self.created, "elapsed_s": round(self.elapsed_s, 2),
                "budget_s": self.budget_s, "cached": self.cached, "note": self.note,
                "candidates": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        if d.get("version") != SELECTOR_VERSION:
            raise ValueError("written by another selector version")
        return cls(Choice.from_dict(d["choice"]), [Row.from_dict(r) for r in d["candidates"]],
                   str(d["gate"]), str(d.get("inputs", "")), str(d.get("key", "")),
                   float(d.get("created", 0)), float(d.get("elapsed_s", 0)),
                   float(d.get("budget_s", DEFAULT_BUDGET_S)), True, str(d.get("note", "")))

    def summary(self) -> str:
        """One line: what was picked, how fast, against what."""
        picked = next((r for r in self.rows if r.status == "picked"), None)
        n_ok = sum(r.status in ("ok", "picked") for r in self.rows)
        n_bad = sum(r.status in ("rejected", "failed") for r in self.rows)
        speed = f" {picked.p50_ms:.2f} ms p50" if picked and picked.p50_ms is not None else ""
        base = _baseline(self.rows)
        gain = ""
        if picked and base and picked.p50_ms and base.p50_ms and base is not picked:
            gain = f", {base.p50_ms / picked.p50_ms:.2f}x onnxruntime's {base.choice.label()}"
        how = "cached decision" if self.cached else f"measured in {self.elapsed_s:.1f} s"
        note = f"; {self.note}" if self.note else ""
        return (f"{self.choice.label()}{speed}{gain} ({how}: {n_ok} correct, {n_bad} refused of "
                f"{len(self.rows)} candidates, gate {self.gate}, {self.inputs}{note})")


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def _baseline(rows: Sequence[Row]) -> Row | None:
    ort = [r for r in rows if r.choice.backend == "onnxruntime" and r.p50_ms is not None
           and r.status in ("ok", "picked")]
    return min(ort, key=lambda r: r.p50_ms or math.inf) if ort else None


# -- candidates ----------------------------------------------------------------------------------
def thread_options(cap: int) -> list[int]:
    """1, 2 and the cap (a Pi 4's 4 cores: 1, 2, 4); tiny models often run fastest on one."""
    return sorted({t for t in (1, 2, cap) if 1 <= t <= cap})


def backend_available(name: str) -> bool:
    """Whether the optional backend ``name`` can be imported here (no import of it yet)."""
    if name == "onnxruntime":
        return _dist_version("onnxruntime") is not None or _dist_version("onnxruntime-gpu") \
            is not None
    if name == "litert":
        return _dist_version("ai-edge-litert") is not None or \
            _dist_version("tflite-runtime") is not None
    mod, dist = _OPTIONAL[name]
    if name == "armnn":
        import importlib.util

        return importlib.util.find_spec("pyarmnn") is not None and \
            importlib.util.find_spec(mod) is not None
    import importlib.util

    return _dist_version(dist) is not None and importlib.util.find_spec(mod) is not None


def _backend_module(name: str) -> Any:
    import importlib

    return importlib.import_module(_OPTIONAL[name][0] if name in _OPTIONAL else
                                   BACKENDS[name].split(":")[0])


def _precisions(name: str, allowed: str) -> list[str]:
    """The precisions backend ``name`` offers here, within what ``allowed`` permits."""
    if allowed == "fp32":
        return ["fp32"]
    try:
        offered = list(_backend_module(name).precisions())
    except (ImportError, AttributeError, EdgeInferError) as exc:
        logger.debug("%s offers no precisions: %s", name, exc)
        return ["fp32"]
    return [p for p in ("fp32", "bf16", "fp16") if p in offered or p == "fp32"]


def wanted_backends(providers: Sequence[str], fmt: str) -> tuple[set[str], list[str]]:
    """``providers`` (normalized) -> the backends to consider and the onnxruntime providers."""
    backends: set[str]
    if tuple(providers) == ("auto",):
        backends = {"onnxruntime", "openvino"} if fmt == "onnx" else {"litert", "openvino",
                                                                      "armnn"}
        return backends, ["auto"]
    backends = set()
    eps: list[str] = []
    for p in providers:
        if p in ("litert", "armnn"):
            backends.add(p)
        elif p == "OpenVINOExecutionProvider":
            backends.add("openvino")
            eps.append(p)
        else:
            eps.append(p)
    if eps and fmt == "onnx":
        backends.add("onnxruntime")
    if eps and fmt == "tflite" and any(e in (CPU, "XnnpackExecutionProvider") for e in eps):
        backends.add("litert")
    return backends, eps


def candidates(spec: SessionSpec, small: bool = False) -> tuple[list[Choice], list[Row]]:
    """Every ``Choice`` worth measuring for ``spec``, most promising first, and the rows of the
    ones asked for that cannot run here (with the reason)."""
    cap = max(1, spec.threads)
    threads = thread_options(cap)
    backends, eps = wanted_backends(spec.providers, spec.format)
    out: list[Choice] = []
    skipped: list[Row] = []
    if spec.format == "onnx" and "onnxruntime" in backends:
        from .onnx import import_ort

        ort = import_ort()
        available = ort.get_available_providers()
        ranked = [c.name for c in rank_providers(available, "auto" if eps == ["auto"] else eps,
                                                 detect_platform())]
        if eps != ["auto"]:
            for name in eps:
                if name not in available and not (name == "OpenVINOExecutionProvider"
                                                   and "openvino" in backends):
                    skipped.append(Row(Choice("onnxruntime", name), "skipped",
                                       reason="not available in this onnxruntime build"))
        for name in ranked:
            if name == CPU:
                for t in sorted(threads, reverse=True):
                    out.append(Choice("onnxruntime", CPU, "fp32", t, "all", False))
                    if t > 1:
                        out.append(Choice("onnxruntime", CPU, "fp32", t, "all", True))
            elif name == "OpenVINOExecutionProvider":
                out.append(Choice("onnxruntime", name, "fp32", cap))
            else:  # GPU/NPU providers: their own threads do not matter
                out.append(Choice("onnxruntime", name, "fp32", cap))
    if spec.format == "tflite" and "litert" in backends:
        for p in _precisions("litert", spec.precision):
            for t in sorted(threads, reverse=True):
                out.append(Choice("litert", "xnnpack", p, t))
        for d in _delegate_libraries(spec):
            out.append(Choice("litert", d, "fp32", cap))
    for name in ("openvino", "armnn"):
        if name not in backends or small:
            continue
        if name == "armnn" and spec.format != "tflite":
            continue
        if not backend_available(name):
            if eps != ["auto"] or name in spec.providers:
                skipped.append(Row(Choice(name, "CPU" if name == "openvino" else "CpuAcc"),
                                   "skipped", reason=f"{name} is not installed"))
            continue
        device = "CPU" if name == "openvino" else "CpuAcc"
        for p in _precisions(name, spec.precision):
            for t in sorted(threads, reverse=True):
                out.append(Choice(name, device, p, t))
    # Most promising first: the configured cap of threads, then reduced precision last.
    out.sort(key=lambda c: (c.threads != cap, c.precision != "fp32", c.spin))
    return list(dict.fromkeys(out)), skipped


def _delegate_libraries(spec: SessionSpec) -> list[str]:
    if spec.delegates:
        return [d.library for d in spec.delegates]
    from .delegates import find_delegates

    return [d.library for d in find_delegates()]


def reference_choice(spec: SessionSpec) -> Choice:
    """The configuration whose outputs are the truth: the plain fp32 kernels of the model's own
    runtime (onnxruntime's CPU provider with basic optimizations; LiteRT's XNNPACK in fp32)."""
    if spec.format == "onnx":
        return Choice("onnxruntime", CPU, "fp32", max(1, spec.threads), "basic", False)
    return Choice("litert", "xnnpack", "fp32", max(1, spec.threads))


def default_choice(spec: SessionSpec) -> Choice:
    """What serves before (or without) measuring: onnxruntime's CPU provider fully optimized,
    spinning off; LiteRT with XNNPACK."""
    if spec.format == "onnx":
        return Choice("onnxruntime", CPU, "fp32", max(1, spec.threads), "all", False)
    return Choice("litert", "xnnpack", "fp32", max(1, spec.threads))


# -- the cache -----------------------------------------------------------------------------------
def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> dict[str, str | None]:
    return {d: _dist_version(d) for d in ("onnxruntime", "onnxruntime-gpu", "openvino",
                                          "ai-edge-litert", "tflite-runtime")}


def cache_key(spec: SessionSpec, gate_key: str) -> str:
    """The decision's key: model, backend versions, CPU and its features, the options."""
    platform = detect_platform()
    parts = {
        "v": SELECTOR_VERSION, "sha256": spec.sha256, "format": spec.format,
        "versions": _versions(), "machine": platform.machine, "cpu": platform.cpu_model,
        "features": cpu_features_digest(), "threads": spec.threads,
        "providers": list(spec.providers), "precision": spec.precision,
        "shapes": {k: list(v) for k, v in sorted(spec.input_shapes.items())},
        "delegates": [d.library for d in spec.delegates], "gate": gate_key,
        "memory_limit_mb": spec.memory_limit_mb, "armnn": _armnn_version(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _armnn_version() -> str | None:
    import importlib.util

    return "present" if importlib.util.find_spec("pyarmnn") is not None else None


def cache_path(spec: SessionSpec, key: str) -> Path | None:
    return spec.state_dir / "select" / f"{key}.json" if spec.state_dir is not None else None


def load_cached(spec: SessionSpec, gate_key: str) -> Decision | None:
    """The cached decision for ``spec`` under ``gate_key``, or None (none, or unreadable)."""
    key = cache_key(spec, gate_key)
    path = cache_path(spec, key)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return Decision.from_dict(json.load(f))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring the damaged backend decision %s: %s", path, exc)
        return None


def store(spec: SessionSpec, decision: Decision) -> None:
    path = cache_path(spec, decision.key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(decision.to_dict(), f, indent=1)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not cache the backend decision in %s: %s", path, exc)


def forget(spec: SessionSpec, gate_key: str) -> None:
    path = cache_path(spec, cache_key(spec, gate_key))
    if path is not None:
        path.unlink(missing_ok=True)


# -- opening and measuring -----------------------------------------------------------------------
Opener = Callable[[SessionSpec], Session]


def open_choice(spec: SessionSpec, choice: Choice, *, warmup: bool = False) -> Session:
    """Open exactly ``choice`` (no warm-up unless asked: measuring runs it anyway)."""
    factory = resolve(BACKENDS, choice.backend, "backend")
    session: Session = factory(spec.replace(choice=choice, warmup=warmup, probe=False))
    return session


def measure(
    spec: SessionSpec,
    gate: Gate | None = None,
    *,
    budget_s: float = DEFAULT_BUDGET_S,
    opener: Callable[[SessionSpec, Choice], Session] | None = None,
    choices: Iterable[Choice] | None = None,
    keep_winner: bool = True,
) -> tuple[Decision, Session | None]:
    """Measure the candidates and return the decision and, with ``keep_winner``, the winner's
    open session (the caller owns it). Never raises for a candidate's failure: each is a row.

    Raises:
        ModelLoadError: not even the reference configuration opens (the model is broken).
    """
    gate_: Gate = gate or OutputsGate()
    open_ = opener or (lambda s, c: open_choice(s, c))
    t0 = time.perf_counter()
    deadline = t0 + budget_s
    ref_choice = reference_choice(spec)
    ref = open_(spec, ref_choice)
    # Open sessions by choice: the reference and the current best few. Closed at the end, except
    # the winner's, which is handed to the caller.
    owned: dict[Choice, Session] = {ref_choice: ref}
    try:
        feeds, inputs_note = _inputs(spec, gate_, ref)
        if feeds is None:
            note = f"not measured: {inputs_note}"
            choice = default_choice(spec)
            decision = Decision(choice, [Row(choice, "picked", reason=note)], gate_.key,
                                inputs_note, note=note)
            return _finish(decision, t0, budget_s), None
        reference = [ref.run(f) for f in feeds]
        ref_row = Row(ref_choice, "ok", accuracy="reference")
        _time(ref, feeds[0], ref_row, MIN_RUNS, t0 + min(1.0, budget_s / 10))
        small = ref_row.p50_ms is not None and ref_row.p50_ms < SMALL_MS
        cands, rows = candidates(spec, small=small)
        if choices is not None:
            cands = list(choices)
        rows.append(ref_row)
        for i, choice in enumerate(cands):
            if choice == ref_choice:
                continue
            left = deadline - time.perf_counter()
            if left <= 0:
                rows.append(Row(choice, "skipped", reason=f"probe budget {budget_s:g} s spent"))
                continue
            slice_s = min(2.0, 0.6 * left / max(1, len(cands) - i))
            row, session = _try(spec, choice, open_, feeds, reference, gate_, slice_s)
            rows.append(row)
            if session is not None:
                owned[choice] = session
                _keep_best(owned, rows, ref_choice)
        _finalists(spec, rows, owned, open_, feeds, deadline)
        note = "runs in under 0.5 ms: only onnxruntime measured" if small else ""
        winner = _pick(rows)
        if winner is None:  # every candidate refused: the reference configuration is correct
            winner = ref_row
            note = "; ".join(filter(None, [note, "every candidate refused: serving the "
                                                 "reference configuration"]))
        winner.status = "picked"
        decision = Decision(winner.choice, rows, gate_.key, inputs_note, note=note)
        session = None
        if keep_winner:
            session = owned.pop(winner.choice, None) or open_(spec, winner.choice)
        return _finish(decision, t0, budget_s), session
    finally:
        for s in owned.values():
            s.close()
        trim_heap()


def _keep_best(owned: dict[Choice, Session], rows: Sequence[Row], ref_choice: Choice) -> None:
    """Close the sessions that are not among the best ``FINALISTS`` so far (the reference's
    stays: it is the fallback winner)."""
    timed = {r.choice: r.p50_ms for r in rows if r.status == "ok" and r.p50_ms is not None}
    best = sorted(timed, key=lambda c: timed[c] or math.inf)[:FINALISTS]
    for choice in [c for c in owned if c not in best and c != ref_choice]:
        owned.pop(choice).close()


def _finish(decision: Decision, t0: float, budget_s: float) -> Decision:
    decision.elapsed_s = time.perf_counter() - t0
    decision.budget_s = budget_s
    decision.created = time.time()
    return decision


def _inputs(spec: SessionSpec, gate: Gate, ref: Session
            ) -> tuple[list[dict[str, np.ndarray]] | None, str]:
    try:
        samples = gate.sample_feeds(ref.inputs)
    except EdgeInferError as exc:
        logger.info("no sample inputs for %s (%s); using made-up ones", spec.path.name, exc)
        samples = []
    if samples:
        return samples, f"{len(samples)} sample input{'s' if len(samples) != 1 else ''}"
    try:
        base, _ = warmup_feeds(ref.inputs, spec.input_shapes, spec.warmup_inputs)
    except InvalidInputError as exc:
        return None, f"no input can be made up ({exc})"
    rng = np.random.default_rng(0)
    feeds = {n: rng.random(v.shape, dtype=np.float32).astype(v.dtype)
             if v.dtype.kind == "f" and n not in spec.warmup_inputs else v
             for n, v in base.items()}
    try:
        ref.run(feeds)
    except EdgeInferError:  # random values refused (a Reshape shape...): zeros as the warm-up
        try:
            ref.run(base)
        except EdgeInferError as exc:
            return None, f"the model refused made-up inputs ({str(exc)[:160]})"
        return [base], "made-up inputs (zeros)"
    return [feeds], "seeded random inputs"


def _try(spec: SessionSpec, choice: Choice, open_: Callable[[SessionSpec, Choice], Session],
         feeds: list[dict[str, np.ndarray]], reference: list[dict[str, np.ndarray]],
         gate: Gate, slice_s: float) -> tuple[Row, Session | None]:
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
            _time(session, feeds[0], row, MIN_RUNS, time.perf_counter() + slice_s)
            return row, session
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


def _time(session: Session, feeds: Mapping[str, np.ndarray], row: Row, min_runs: int,
          until: float) -> None:
    session.run(feeds)  # one untimed run: caches, lazy allocations
    n = 0
    while n < min_runs or (time.perf_counter() < until and n < MAX_RUNS):
        t = time.perf_counter()
        session.run(feeds)
        row.samples.append((time.perf_counter() - t) * 1000)
        n += 1
    _stats(row)


def _stats(row: Row) -> None:
    s = sorted(row.samples)
    row.runs = len(s)
    row.p50_ms = statistics.median(s)
    row.p99_ms = s[min(len(s) - 1, int(math.ceil(0.99 * len(s))) - 1)]


def _finalists(spec: SessionSpec, rows: list[Row], owned: dict[Choice, Session],
               open_: Callable[[SessionSpec, Choice], Session],
               feeds: list[dict[str, np.ndarray]], deadline: float) -> None:
    """Time the best few again, interleaved (one run each per round), replacing their numbers:
    a noisy moment during one candidate's own slice must not decide."""
    ok = sorted((r for r in rows if r.status == "ok" and r.p50_ms is not None),
                key=lambda r: r.p50_ms or math.inf)[:FINALISTS]
    if len(ok) < 2 or time.perf_counter() >= deadline:
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
        while n < MAX_RUNS and (n < 5 or time.perf_counter() < deadline):
            for i in order if n % 2 == 0 else order[::-1]:
                t = time.perf_counter()
                sessions[i][1].run(feeds[0])
                rounds[i].append((time.perf_counter() - t) * 1000)
            n += 1
        for (r, _), samples in zip(sessions, rounds):
            r.samples = samples
            _stats(r)
    except EdgeInferError as exc:
        logger.warning("interleaved timing of %s stopped: %s", spec.path.name, exc)


def _cost(c: Choice) -> tuple[int, int, int, int]:
    return (c.threads, int(c.spin), int(c.precision != "fp32"), int(c.backend != "onnxruntime"))


def _pick(rows: Sequence[Row]) -> Row | None:
    ok = [r for r in rows if r.status == "ok" and r.p50_ms is not None]
    if not ok:
        return None
    best = min(r.p50_ms or math.inf for r in ok)
    near = [r for r in ok if (r.p50_ms or math.inf) <= best * TIE]
    return min(near, key=lambda r: (_cost(r.choice), r.p50_ms or math.inf))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:240]


# -- what load_model calls -----------------------------------------------------------------------
def open_selected(spec: SessionSpec, gate: Gate | None = None,
                  budget_s: float = DEFAULT_BUDGET_S) -> Session:
    """The session of the cached winner, or measure now, cache, and return the winner's.

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
            _annotate(session, cached)
            return session
    decision, measured = measure(spec, gate_, budget_s=budget_s)
    decision.key = cache_key(spec, gate_.key)
    store(spec, decision)
    if measured is None:  # not measurable: the default configuration
        session = open_choice(spec, decision.choice, warmup=spec.warmup)
    else:
        session = measured
        if spec.warmup:
            from .base import warm_up

            warm_up(session, spec)
    _annotate(session, decision)
    session.report.fallbacks.extend(fallbacks)
    logger.info("%s: picked %s", spec.path.name, decision.summary())
    return session


def _annotate(session: Session, decision: Decision) -> None:
    report = session.report
    report.selection = decision.to_dict()
    report.selection["summary"] = decision.summary()
    known = {f.provider for f in report.fallbacks}
    for r in decision.rows:  # asked for by name and not runnable here: never silent
        if r.status == "skipped" and "budget" not in r.reason and r.choice.provider not in known:
            report.fallbacks.append(Fallback(r.choice.provider, r.reason))
    if report.choice is None:
        session.report.choice = decision.choice


def describe_platform() -> dict[str, Any]:
    """What the decision depends on, for ``edgeinfer info``."""
    p = detect_platform()
    feats = cpu_features()
    keys = sorted(f for f in feats if f.startswith(("avx512", "amx", "avx_vnni", "asimd", "fphp",
                                                     "bf16", "i8mm", "sve")) or f in ("avx2",
                                                                                      "fma"))
    return {"machine": p.machine, "cpu": p.cpu_model, "features": keys,
            "versions": {k: v for k, v in _versions().items() if v}}


__all__ = ["BACKENDS", "Decision", "Gate", "OutputsGate", "Row", "candidates", "default_choice",
           "load_cached", "measure", "open_choice", "open_selected", "reference_choice"]
