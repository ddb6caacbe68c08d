"""The benchmark harness behind ``edgeinfer bench``.

Each configuration (one provider, one thread count) is measured in a fresh child process
(``python -m edgeinfer.bench SPEC.json``), so its load is cold and its peak resident memory is
its own: load, warm-up runs, then timed runs of ``Model.run`` on random inputs of each input's
shape and dtype. The child writes its result as JSON to a file named in the spec; an error in the
child comes back as the same ``edgeinfer.errors`` class.

    results = bench("model.onnx", providers="cpu", threads=[1, 2], runs=50)
    for r in results:
        r.latency_ms["p50"], r.throughput, r.peak_rss_mb

``providers="all"`` or ``"auto"`` is the measuring selector's table instead
(:func:`candidate_table`): every candidate ``Choice`` (backend x device x precision x threads x
graph optimization x spinning) opened, checked against the fp32 reference and timed in this
process, exactly as ``load_model``'s first-load probe does, with what ``providers: auto`` picks
marked:

    table = candidate_table("model.onnx", providers="all", threads=2, budget_s=60)
    table.auto.label(), [r.to_dict() for r in table.rows]
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import errors
from .errors import ConfigError, EdgeInferError, ModelError

if TYPE_CHECKING:
    from .runtime.base import Choice
    from .runtime.select import Decision, Row

__all__ = [
    "BenchResult", "CandidateTable", "bench", "candidate_table", "make_inputs", "parse_threads",
    "plot_candidates", "plot_histograms", "resolve_providers", "summarize",
]

logger = logging.getLogger(__name__)

PERCENTILES = (50, 90, 99)
# Inputs that hold a setting rather than data: random values would be invalid (Silero's ``sr``).
_SILERO_INPUTS = {"input", "state", "sr"}


@dataclass(slots=True)
class BenchResult:
    """One configuration's measurement.

    Attributes:
        requested: the provider asked for (``auto`` or an onnxruntime/LiteRT name).
        provider: the provider that really ran (after verification); empty if it failed.
        threads: intra-op threads (``None``: the runtime's default).
        load_ms: ``load_model`` in the fresh process, without warm-up.
        warmup_ms: all warm-up runs together.
        runs: timed runs.
        latency_ms: ``p50``, ``p90``, ``p99``, ``mean``, ``min``, ``max``.
        throughput: timed runs per second of wall time.
        peak_rss_mb: the child process's peak resident memory (imports, load and runs).
        baseline_rss_mb: its resident memory after imports, before loading.
        latencies: every timed run, ms, in order.
        cache: the optimized-model cache outcome (``hit``, ``miss``, ``off``).
        error: why this configuration could not be measured, else ``None``.
    """

    requested: str
    threads: int | None
    provider: str = ""
    load_ms: float = 0.0
    warmup_ms: float = 0.0
    runs: int = 0
    latency_ms: dict[str, float] = field(default_factory=dict)
    throughput: float = 0.0
    peak_rss_mb: float = 0.0
    baseline_rss_mb: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cache: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``latencies`` included)."""
        return asdict(self)


def parse_threads(text: str | None) -> list[int | None]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; ``None`` or ``""`` -> ``[None]`` (the runtime's default).

    Raises:
        ConfigError: not a comma-separated list of positive integers.
    """
    if not text:
        return [None]
    out: list[int | None] = []
    for item in text.split(","):
        try:
            n = int(item)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--threads {text!r}: expected positive integers such as 1,2,4")
        out.append(n)
    return list(dict.fromkeys(out))


def resolve_providers(model_format: str, providers: str) -> list[str]:
    """The providers to measure: ``auto`` -> ``["auto"]``; ``all`` -> every available ONNX
    provider in ``auto`` order (CPU last; LiteRT: ``["auto"]``); else the normalized list
    (LiteRT: only ``cpu``, meaning no external delegate).

    Raises:
        ConfigError: an unknown provider name.
    """
    from .runtime import providers as prov

    key = providers.strip().lower()
    if key == "auto":
        return ["auto"]
    if key == "all":
        if model_format != "onnx":
            return ["auto"]
        import onnxruntime as ort

        ranked = prov.rank_providers(ort.get_available_providers(), "auto", prov.detect_platform())
        return [c.name for c in ranked]
    names = list(prov.normalize(providers))
    if model_format != "onnx" and names != [prov.CPU]:
        raise ConfigError(f"--providers {providers!r}: a {model_format} model runs on LiteRT; "
                          "use auto (a delegate found on this system, else XNNPACK), all, or cpu")
    return names


def bench(
    model: str | os.PathLike[str],
    *,
    providers: str = "auto",
    threads: Sequence[int | None] = (None,),
    runs: int = 50,
    warmup: int = 5,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    timeout: float | None = None,
) -> list[BenchResult]:
    """Measure ``model`` once per (provider, thread count), each in a fresh child process.

    A configuration whose provider fails (not available, falls back, crashes) becomes a result
    with ``error`` set. An error about the model or the options (corrupt file, missing input
    shape) is raised at once; so is the first error when no configuration could be measured.

    Raises:
        ConfigError: bad options, or a dynamic input dimension with no ``input_shapes`` entry.
        ModelError: the model file is missing, corrupt or refused.
        EdgeInferError: every configuration failed (the first one's error).
    """
    from .catalog import resolve_model
    from .runtime.modelfile import inspect_model

    if runs < 1 or warmup < 0:
        raise ConfigError(f"runs must be >= 1 and warmup >= 0, got runs={runs}, warmup={warmup}")
    path = resolve_model(model)
    info = inspect_model(path, max_model_mb=1 << 20)
    shapes = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    results: list[BenchResult] = []
    first_error: EdgeInferError | None = None
    for provider in resolve_providers(info.format, providers):
        for n in threads:
            spec = {"model": str(path), "provider": provider, "threads": n, "runs": runs,
                    "warmup": warmup, "input_shapes": shapes}
            try:
                results.append(_measure_in_child(spec, timeout))
            except (ConfigError, ModelError):
                raise
            except EdgeInferError as exc:
                logger.info("bench %s threads=%s failed: %s", provider, n, exc)
                first_error = first_error or exc
                results.append(BenchResult(requested=provider, threads=n, error=str(exc)))
    if first_error is not None and all(r.error for r in results):
        raise first_error
    return results


def _measure_in_child(spec: dict[str, Any], timeout: float | None) -> BenchResult:
    with tempfile.TemporaryDirectory(prefix="edgeinfer-bench-") as tmp:
        out = Path(tmp) / "result.json"
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps({**spec, "out": str(out)}))
        cmd = [sys.executable, "-m", "edgeinfer.bench", str(spec_file)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise errors.InferenceError(f"benchmark child timed out after {timeout} s") from exc
        if not out.exists():
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
            raise errors.WorkerCrashedError(
                f"benchmark child exited with {proc.returncode} and no result: {tail}")
        data = json.loads(out.read_text())
    if "error" in data:
        cls = getattr(errors, data["error"]["type"], EdgeInferError)
        if not (isinstance(cls, type) and issubclass(cls, EdgeInferError)):
            cls = EdgeInferError
        raise cls(data["error"]["message"])
    return BenchResult(**data["result"])


# -- the candidate table (providers all / auto) ------------------------------------------------

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
    from . import paths
    from .catalog import for_path, resolve_model
    from .model import DEFAULT_ARENA
    from .runtime import select
    from .runtime.base import PRECISIONS, Choice, SessionSpec, TensorSpec
    from .runtime.decision import DEFAULT_BUDGET_S
    from .runtime.memory import default_threads
    from .runtime.modelfile import inspect_model

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
        input_shapes=shapes, arena=DEFAULT_ARENA, cache_dir=paths.cache_dir(), state_dir=None,
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
    decision, _ = select.measure(spec, budget_s=budget, choices=choices, keep_winner=False)
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
    from .runtime import select

    ref_choice = select.reference_choice(spec)
    ref = next((r for r in decision.rows if r.choice == ref_choice), None)
    small = ref is not None and ref.p50_ms is not None and ref.p50_ms < select.SMALL_MS
    own = set(select.candidates(spec, small=small)[0]) | {ref_choice}
    for r in decision.rows:
        if r.status == "picked":
            r.status = "ok"
    considered = [r for r in decision.rows if r.choice in own and r.choice not in extra]
    winner = select._pick(considered) or ref
    if winner is None:  # measure() always times the reference; kept for the type checker
        return decision.choice
    winner.status = "picked"
    decision.choice = winner.choice
    decision.note = ("runs in under 0.5 ms: auto measures only onnxruntime, the other backends "
                     "are shown for comparison" if small else "")
    return winner.choice


def plot_candidates(table: CandidateTable, out: str | os.PathLike[str]) -> Path:
    """Draw the table as a PNG (Pillow only): one bar per measured candidate, p50 as the bar and
    p99 as a whisker, auto's pick marked; rejected and failed candidates listed with the reason.
    """
    from PIL import Image, ImageDraw, ImageFont

    rows = table.rows
    timed = [r for r in rows if r.p50_ms is not None]
    refused = [r for r in rows if r.p50_ms is None]
    bar_h, label_w, w = 24, 330, 1000
    top = 56
    h = top + bar_h * len(timed) + 50 + 18 * len(refused) + 30
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    try:
        font: Any = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    left, right = label_w, w - 150
    # A p99 far out (a noisy moment) is cut at 3x the slowest p50, its value still written.
    slowest = max([r.p50_ms or 0.0 for r in timed] + [1e-3])
    hi = min(max([r.p99_ms or r.p50_ms or 0.0 for r in timed] + [1e-3]), 3 * slowest)
    draw.text((10, 8), f"{table.model.name}: {table.mode} candidates, threads up to "
              f"{table.threads}, precision >= {table.precision}, gate {table.decision.gate}",
              fill="black", font=font)
    draw.text((10, 26), f"bar: p50 ms, whisker: p99 ms; * = providers: auto's pick "
              f"({table.auto.label()})", fill="black", font=font)

    def sx(v: float) -> float:
        return left + v / hi * (right - left)

    colors = {"picked": (40, 140, 60), "ok": (120, 150, 190), "rejected": (210, 120, 60)}
    for i, r in enumerate(timed):
        y = top + i * bar_h
        mark = "* " if r.choice == table.auto else "  "
        extra = " (comparison)" if r.choice in table.extra else \
            " (fp32 reference)" if r.accuracy == "reference" else ""
        draw.text((10, y + 5), f"{mark}{r.choice.label()}{extra}", fill="black", font=font)
        p50 = r.p50_ms or 0.0
        draw.rectangle([left, y + 4, sx(p50), y + bar_h - 4],
                       fill=colors.get(r.status, (160, 160, 160)))
        p99 = min(r.p99_ms or p50, hi)
        if r.p99_ms is not None:
            ym = y + bar_h // 2
            draw.line([sx(p50), ym, sx(p99), ym], fill="black")
            if p99 < r.p99_ms:  # cut: an arrow head
                draw.polygon([(sx(p99), ym - 4), (sx(p99) + 6, ym), (sx(p99), ym + 4)],
                             fill="black")
            else:
                draw.line([sx(p99), ym - 4, sx(p99), ym + 4], fill="black")
        end = sx(max(p50, p99)) + 6
        draw.text((end + 6, y + 5), f"{p50:.2f} / {r.p99_ms or p50:.2f}", fill="black",
                  font=font)
    axis_y = top + bar_h * len(timed) + 4
    draw.line([left, top - 4, left, axis_y], fill="black")
    draw.line([left, axis_y, right, axis_y], fill="black")
    for k in range(6):
        v = k * hi / 5
        draw.line([sx(v), axis_y, sx(v), axis_y + 4], fill="black")
        draw.text((sx(v) - 12, axis_y + 6), f"{v:.1f}", fill="black", font=font)
    draw.text(((left + right) / 2 - 30, axis_y + 22), "ms per run", fill="black", font=font)
    y = axis_y + 46
    for r in refused:
        text = f"{r.status}: {r.choice.label()}: {r.reason}"
        draw.text((10, y), text[:150], fill=(170, 60, 20) if r.status == "rejected"
                  else (110, 110, 110), font=font)
        y += 18
    path = Path(out)
    img.save(path, format="PNG")
    return path

# -- the latency histogram ----------------------------------------------------------------------


def plot_histograms(results: Sequence[BenchResult], out: str | os.PathLike[str],
                    bins: int = 30) -> Path:
    """Draw one latency histogram per measured configuration into one PNG (Pillow only).

    Each panel has counts against milliseconds, with p50 and p99 marked. Runs slower than the
    panel's range (a long tail) are counted in the last bin, and the panel says how many.

    Raises:
        ConfigError: no configuration has latencies to draw.
    """
    from PIL import Image, ImageDraw, ImageFont

    rows = [r for r in results if r.latencies]
    if not rows:
        raise ConfigError("nothing to plot: no configuration was measured")
    w, h = 720, 300
    img = Image.new("RGB", (w, h * len(rows)), "white")
    draw = ImageDraw.Draw(img)
    try:
        font: Any = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1 has one bitmap size
        font = ImageFont.load_default()
    for i, r in enumerate(rows):
        _panel(draw, font, r, (0, i * h, w, h), bins)
    path = Path(out)
    img.save(path, format="PNG")
    return path


def _panel(draw: Any, font: Any, r: BenchResult, box: tuple[int, int, int, int], bins: int) -> None:
    import numpy as np

    x0, y0, w, h = box
    left, right, top, bottom = x0 + 60, x0 + w - 20, y0 + 40, y0 + h - 45
    p50, p99 = r.latency_ms["p50"], r.latency_ms["p99"]
    lo = r.latency_ms["min"]
    hi = min(r.latency_ms["max"], p99 + 0.25 * (p99 - lo)) if p99 > lo else lo + 1e-3
    hi = max(hi, lo + 1e-3)
    data = np.clip(np.asarray(r.latencies), lo, hi)
    counts, edges = np.histogram(data, bins=bins, range=(lo, hi))
    tail = int((np.asarray(r.latencies) > hi).sum())
    top_count = max(int(counts.max()), 1)

    def sx(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (right - left)

    def sy(c: float) -> float:
        return bottom - c / top_count * (bottom - top)

    title = (f"{r.provider or r.requested}, threads {r.threads or 'default'}: p50 {p50:.2f} ms, "
             f"p99 {p99:.2f} ms, {r.runs} runs" + (f" ({tail} slower in last bin)" if tail else ""))
    draw.text((left, y0 + 12), title, fill="black", font=font)
    for c, a, b in zip(counts, edges[:-1], edges[1:]):
        if c:
            draw.rectangle([sx(a) + 1, sy(c), sx(b) - 1, bottom], fill=(120, 150, 190))
    draw.line([left, bottom, right, bottom], fill="black")
    draw.line([left, top, left, bottom], fill="black")
    for k in range(6):
        v = lo + k * (hi - lo) / 5
        draw.line([sx(v), bottom, sx(v), bottom + 4], fill="black")
        draw.text((sx(v) - 14, bottom + 6), f"{v:.2f}", fill="black", font=font)
    draw.text(((left + right) / 2 - 40, bottom + 24), "latency, ms", fill="black", font=font)
    step = -(-top_count // 4)
    for c in range(0, top_count + 1, step):
        draw.line([left - 4, sy(c), left, sy(c)], fill="black")
        draw.text((x0 + 8, sy(c) - 7), str(c), fill="black", font=font)
    draw.text((x0 + 8, top - 22), "runs", fill="black", font=font)
    for v, label, color in ((p50, "p50", (0, 110, 0)), (p99, "p99", (200, 0, 0))):
        x = sx(min(v, hi))
        draw.line([x, top, x, bottom], fill=color, width=2)
        text = f"{label} {v:.2f}"
        width = draw.textlength(text, font=font)
        tx = x + 3 if x + 3 + width <= right else x - 3 - width
        draw.text((tx, top + (0 if label == "p50" else 14)), text, fill=color, font=font)


# -- the child side ----------------------------------------------------------------------------


def make_inputs(specs: Sequence[Any], fixed: Mapping[str, Sequence[int]] | None = None,
                values: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """Random inputs for ``specs`` (``TensorSpec``): floats uniform in [0, 1) (quantized TFLite
    inputs, fed as float, in [-1, 1)), integers and booleans zero, inputs named in ``values``
    that value broadcast.

    Raises:
        ConfigError: an input has a dynamic dimension and ``fixed`` has no shape for it.
    """
    import numpy as np

    fixed = fixed or {}
    values = values or {}
    rng = np.random.default_rng(seed)
    feeds: dict[str, Any] = {}
    for spec in specs:
        shape = tuple(fixed.get(spec.name, spec.shape))
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            dims = ",".join(str(d) if isinstance(d, int) and d >= 0 else "?" for d in spec.shape)
            example = ",".join(f"D{i + 1}" for i in range(len(spec.shape)))
            raise ConfigError(
                f"input {spec.name!r} has dynamic dimensions [{dims}]; give its shape with "
                f"--input-shape {spec.name}={example} (input_shapes= in the Python API)")
        dtype = np.dtype(spec.dtype)
        if spec.name in values:
            feeds[spec.name] = np.broadcast_to(np.asarray(values[spec.name], dtype), shape).copy()
        elif getattr(spec, "quantization", None) is not None:
            feeds[spec.name] = rng.uniform(-1, 1, shape).astype(np.float32)
        elif dtype.kind == "f":
            feeds[spec.name] = rng.random(shape, dtype=np.float32).astype(dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype)
    return feeds


def _known_options(input_names: set[str], shapes: dict[str, list[int]]) -> dict[str, Any]:
    """Shapes and values that make a known model valid (Silero VAD's ``sr``, its window)."""
    if input_names != _SILERO_INPUTS:
        return {"input_shapes": shapes, "values": {}}
    from .tasks.vad import silero_load_options

    opts = silero_load_options()
    return {"input_shapes": {**opts["input_shapes"], **shapes}, "values": opts["warmup_inputs"]}


def _rss_mb(field_name: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def summarize(latencies: Sequence[float]) -> dict[str, float]:
    """``p50``/``p90``/``p99`` (linear interpolation), ``mean``, ``min``, ``max`` of ``latencies``."""
    import numpy as np

    a = np.asarray(latencies, dtype=np.float64)
    stats = {f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}
    stats.update(mean=float(a.mean()), min=float(a.min()), max=float(a.max()))
    return stats


def _child_measure(spec: dict[str, Any]) -> BenchResult:
    import numpy as np  # noqa: F401  (imported before the baseline so it is part of it)

    from .model import load_model
    from .runtime.modelfile import inspect_model

    path = Path(spec["model"])
    info = inspect_model(path, max_model_mb=1 << 20)
    names = set(info.onnx.inputs) if info.onnx is not None else set()
    known = _known_options(names, spec["input_shapes"])
    baseline = _rss_mb("VmRSS")
    start = time.perf_counter()
    model = load_model(path, providers=spec["provider"], threads=spec["threads"],
                       strict_providers=spec["provider"] != "auto", warmup=False,
                       input_shapes=known["input_shapes"] or None)
    load_ms = (time.perf_counter() - start) * 1000
    with model:
        feeds = make_inputs(model.inputs, known["input_shapes"], known["values"])
        start = time.perf_counter()
        for _ in range(spec["warmup"]):
            model.run(feeds)
        warmup_ms = (time.perf_counter() - start) * 1000
        lat: list[float] = []
        clock = time.perf_counter
        wall = clock()
        for _ in range(spec["runs"]):
            t0 = clock()
            model.run(feeds)
            lat.append((clock() - t0) * 1000)
        wall = clock() - wall
        provider, cache = model.provider, model.report.cache
    return BenchResult(
        requested=spec["provider"], threads=spec["threads"], provider=provider, load_ms=load_ms,
        warmup_ms=warmup_ms, runs=len(lat), latency_ms=summarize(lat),
        throughput=len(lat) / wall if wall > 0 else 0.0, peak_rss_mb=_rss_mb("VmHWM"),
        baseline_rss_mb=baseline, latencies=lat, cache=cache,
    )


def _child_main(argv: Sequence[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(spec["out"])
    try:
        data: dict[str, Any] = {"result": _child_measure(spec).to_dict()}
        code = 0
    except EdgeInferError as exc:
        data = {"error": {"type": type(exc).__name__, "message": str(exc)}}
        code = exc.exit_code
    except Exception as exc:  # reported to the parent as a crash of this configuration
        data = {"error": {"type": "InferenceError", "message": f"{type(exc).__name__}: {exc}"}}
        code = 70
    out.write_text(json.dumps(data))
    return code


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
