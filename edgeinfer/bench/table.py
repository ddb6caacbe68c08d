"""The measuring selector's candidate table behind ``edgeinfer bench --providers all|auto``:
every candidate ``Choice`` (backend x device x precision x threads x graph optimization x
spinning) opened, checked against the fp32 reference and timed in this process, exactly as
``load_model``'s first-load probe does, with what ``providers: auto`` picks marked.

    table = candidate_table("model.onnx", providers="all", threads=2, budget_s=60)
    table.auto.label(), [r.to_dict() for r in table.rows]
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import paths
from ..model.catalog import for_path, resolve_model
from ..errors import ConfigError
from ..runtime import select
from ..runtime.guarded import measure_guarded
from ..runtime.base import PRECISIONS, Choice, SessionSpec, TensorSpec
from ..runtime.decision import DEFAULT_BUDGET_S, Decision, Row
from ..runtime.memory import default_threads
from ..runtime.modelfile import inspect_model
from .harness import make_inputs

__all__ = ["ALL_BUDGET_S", "CANDIDATE_MODES", "CandidateTable", "candidate_table"]

CANDIDATE_MODES = ("all", "auto")
ALL_BUDGET_S = 60.0  # --providers all: every candidate gets its full slice


@dataclass(slots=True)
class CandidateTable:
    """What the measuring selector measured for one model, and what ``providers: auto`` picks.

    Attributes:
        model, format, sha256: the model file.
        mode: ``"auto"``: exactly the first-load probe of ``load_model`` (its candidates, its
            shortcut for models under half a millisecond); ``"all"``: every candidate the device
            offers, the shortcut off, plus onnxruntime at ``ORT_ENABLE_EXTENDED`` (edgeinfer's
            former default) for comparison; the pick is still made among the probe's own.
        threads: the thread cap (candidates run at 1, 2 and the cap).
        precision: the lowest precision allowed (``fp32``, ``fp16`` with bf16, ``int8``).
        decision: the selector's decision; ``decision.rows`` is the table, one ``Row`` per
            candidate, the pick's status ``"picked"``.
        auto: what ``providers: auto`` picks on this table.
        fastest: the fastest correct candidate of the table (may be one auto does not consider).
        extra: the candidates measured only for comparison (auto never picks them).
    """

    model: Path
    format: str
    sha256: str
    mode: str
    threads: int
    precision: str
    decision: Decision
    auto: Choice
    fastest: Choice | None
    extra: list[Choice] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        """Measured first (fastest first), then rejected, failed and skipped ones."""
        order = {"picked": 0, "ok": 0, "rejected": 1, "failed": 2, "skipped": 3}
        return sorted(self.decision.rows, key=lambda r: (order.get(r.status, 4),
                                                         r.p50_ms if r.p50_ms is not None
                                                         else float("inf")))

    def to_dict(self) -> dict[str, Any]:
        d = self.decision
        rows = []
        for r in self.rows:
            row = r.to_dict()
            row["auto"] = r.choice == self.auto
            row["extra"] = r.choice in self.extra
            rows.append(row)
        return {"model": str(self.model), "format": self.format, "sha256": self.sha256,
                "providers": self.mode, "threads": self.threads, "precision": self.precision,
                "gate": d.gate, "inputs": d.inputs, "budget_s": d.budget_s,
                "elapsed_s": round(d.elapsed_s, 2), "note": d.note,
                "auto": {**self.auto.to_dict(), "label": self.auto.label()},
                "fastest": self.fastest.label() if self.fastest else None,
                "summary": d.summary(), "candidates": rows}


def candidate_table(
    model: str | os.PathLike[str],
    *,
    providers: str = "all",
    threads: int | None = None,
    precision: str = "fp16",
    budget_s: float | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    warmup_inputs: Mapping[str, Any] | None = None,
) -> CandidateTable:
    """Measure every candidate way to run ``model`` here with the selector of
    ``load_model(probe=True)`` (``runtime/select.py``), in this process, nothing cached.

    ``input_shapes``/``warmup_inputs`` default to an example model's own (as ``load_model``).
    ``budget_s`` defaults to the probe's 15 s for ``auto`` and 60 s for ``all``.

    Raises:
        ConfigError: bad options, or a dynamic input dimension with no ``input_shapes`` entry.
        ModelError: the model file is missing, corrupt, or does not open even on the reference
            configuration.
    """
    mode = providers.strip().lower()
    if mode not in CANDIDATE_MODES:
        raise ConfigError(f"providers must be one of {CANDIDATE_MODES} here, got {providers!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"--precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}")
    budget = budget_s if budget_s is not None else (
        DEFAULT_BUDGET_S if mode == "auto" else ALL_BUDGET_S)
    if not budget > 0:
        raise ConfigError(f"--budget-s must be > 0, got {budget_s!r}")
    path = resolve_model(model)
    info = inspect_model(path, max_model_mb=1 << 20)
    entry = for_path(model) or for_path(path)
    if entry is not None and entry.sha256 != info.sha256:
        entry = None
    shapes = {n: tuple(d) for n, d in entry.input_shapes} if entry else {}
    shapes.update({k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()})
    values = dict(entry.warmup_inputs) if entry else {}
    values.update(warmup_inputs or {})
    graph_inputs = dict(info.onnx.inputs) if info.onnx is not None else {}
    # A dynamic dimension must be given, not guessed: the same message as the fresh-process mode.
    make_inputs([TensorSpec(n, tuple(d), "float32") for n, d in graph_inputs.items()], shapes)
    cap = threads or default_threads()
    spec = SessionSpec(
        path=info.path.resolve(), format=info.format, sha256=info.sha256, threads=cap,
        providers=("auto",), probe=True, precision=precision, probe_budget_s=budget,
        input_shapes=shapes, cache_dir=paths.cache_dir(), state_dir=None,
        warmup=False, warmup_inputs=values, graph_inputs=graph_inputs,
        external_data=bool(info.onnx is not None and info.onnx.external_data))
    extra: list[Choice] = []
    choices: list[Choice] | None = None
    if mode == "all":
        choices = select.candidates(spec, small=False)[0]
        if info.format == "onnx":
            extended = Choice("onnxruntime", "CPUExecutionProvider", "fp32", cap, "extended")
            if extended not in choices:
                extra.append(extended)
                choices.append(extended)
    # in a child: a candidate that crashes is a row of the table, not the end of the bench
    decision, _ = measure_guarded(spec, budget_s=budget, choices=choices, keep_winner=False)
    auto = decision.choice
    if mode == "all":
        auto = _auto_pick(spec, decision, extra)
    ok = [r for r in decision.rows if r.status in ("ok", "picked") and r.p50_ms is not None]
    fastest = min(ok, key=lambda r: r.p50_ms or float("inf")).choice if ok else None
    return CandidateTable(info.path, info.format, info.sha256, mode, cap, precision, decision,
                          auto, fastest, extra)


def _auto_pick(spec: Any, decision: Decision, extra: Sequence[Choice]) -> Choice:
    """What the probe would pick on this table: among its own candidates only (onnxruntime alone
    for a model under ``SMALL_MS``), the same rule (fastest, near-ties to the cheaper)."""
    ref_choice = select.reference_choice(spec)
    ref = next((r for r in decision.rows if r.choice == ref_choice), None)
    small = ref is not None and ref.p50_ms is not None and ref.p50_ms < select.SMALL_MS
    own = set(select.candidates(spec, small=small)[0]) | {ref_choice}
    for r in decision.rows:
        if r.status == "picked":
            r.status = "ok"
    considered = [r for r in decision.rows if r.choice in own and r.choice not in extra]
    winner = select.pick(considered) or ref
    if winner is None:  # measure() always times the reference; kept for the type checker
        return decision.choice
    winner.status = "picked"
    decision.choice = winner.choice
    decision.note = ("runs in under 0.5 ms: auto measures only onnxruntime, the other backends "
                     "are shown for comparison" if small else "")
    return winner.choice
