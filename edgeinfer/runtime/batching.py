"""Running several pipelines' frames as one batch: the parts that need no loaded model.

A model shared by pipelines (``model/pool.py``) may run the frames waiting from several of
them as one inference, where the model takes a batch: its inputs' first dimension is a
symbolic batch (``[batch, 3, H, W]``), so a second session opened with that dimension fixed to
N runs N frames at once, and each output's first dimension is that batch. Whether that is
faster is measured per backend, on the box (``measure``): B single runs against one batch of
B, interleaved, a few rounds; ``decide`` keeps batching only at >= 1.1x (``SPEEDUP``).

Here: the policy (``model.batch: auto | off | N``), which models cannot batch
(``refusal``), stacking rows and splitting outputs (``stack``, ``split``), the interleaved
measurement and the decision with its reason, which the stats and the log show.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .base import Dim, TensorSpec

SPEEDUP = 1.1  # batching is kept only this much faster than running the frames one by one
MAX_AUTO = 8  # ``batch: auto`` batches at most this many sharers' frames
ROUNDS = 7  # measuring: rounds of (B singles, one batch), order alternating
MIN_ROUNDS = 3
MEASURE_BUDGET_S = 4.0  # measuring stops after this, with at least MIN_ROUNDS done
CONSISTENT = 2 / 3  # auto batches only if this share of the rounds was >= SPEEDUP on its own
WINDOW_MS = 5.0  # default wait for more frames to fill a batch

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How a shared model batches (from ``model.batch`` and ``model.batch_window_ms``).

    Attributes:
        mode: ``"auto"`` (measured, kept where faster), ``"off"``, or ``"fixed"`` (``size``
            frames per batch, as the config names, measured and reported but always used).
        size: The batch of ``"fixed"``; ``auto`` uses the number of sharers (at most 8).
        window_ms: How long the inference thread waits for more frames to fill a batch.
        reason: Why the mode is ``off`` when the config did not say so (a stateful task).
        measurement: Use this instead of measuring (tests and benchmarks inject one).
    """

    mode: str = "auto"
    size: int = 0
    window_ms: float = WINDOW_MS
    reason: str = ""
    measurement: BatchMeasurement | None = None

    @property
    def key(self) -> tuple[str, int, float]:
        """What sharers of one model must agree on."""
        return self.mode, self.size, self.window_ms

    def describe(self) -> str:
        """As the config says it: ``auto``, ``off``, ``4``; with the window."""
        mode = str(self.size) if self.mode == "fixed" else self.mode
        return f"batch: {mode}, batch_window_ms: {self.window_ms:g}"


def batch_policy(batch: str | int, window_ms: float = WINDOW_MS, *,
                 stateful: bool = False) -> BatchPolicy:
    """The policy for ``model.batch`` (``"auto"``, ``"off"`` or a size) and
    ``model.batch_window_ms``; a stateful task (its state carried from frame to frame, VAD)
    never batches.

    Raises:
        ValueError: ``batch`` is none of those.
    """
    if stateful:
        return BatchPolicy("off", 0, window_ms, "a stateful task carries its state frame to frame")
    if batch in ("auto", "off"):
        return BatchPolicy(str(batch), 0, window_ms)
    if isinstance(batch, int) and not isinstance(batch, bool) and 2 <= batch <= 64:
        return BatchPolicy("fixed", batch, window_ms)
    raise ValueError(f"batch must be auto, off or a size 2-64, got {batch!r}")


@dataclass(frozen=True, slots=True)
class BatchMeasurement:
    """B frames run one by one against the same B frames as one batch, interleaved.

    Attributes:
        size: B.
        single_ms: Median time of one single run.
        batch_ms: Median time of one batch of B.
        rounds: Rounds measured.
        max_diff: The largest difference between a batch row and the single run's output,
            relative to the output's range (float rounding: about 1e-6).
        faster_rounds: Rounds whose own batch was >= ``SPEEDUP`` faster than their singles
            (a round's two halves run back to back, so a load spell hits both); ``None``: not
            counted (a measurement given, not made).
    """

    size: int
    single_ms: float
    batch_ms: float
    rounds: int
    max_diff: float = 0.0
    faster_rounds: int | None = None

    @property
    def consistent(self) -> bool:
        """Enough rounds were faster on their own (``CONSISTENT``)."""
        return self.faster_rounds is None or self.faster_rounds >= CONSISTENT * self.rounds

    @property
    def speedup(self) -> float:
        """Throughput of batching over running the frames one by one."""
        return self.size * self.single_ms / self.batch_ms if self.batch_ms > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "single_ms": round(self.single_ms, 3),
                "batch_ms": round(self.batch_ms, 3), "rounds": self.rounds,
                "speedup": round(self.speedup, 3), "max_diff": float(f"{self.max_diff:.3g}"),
                "faster_rounds": self.faster_rounds}


@dataclass(frozen=True, slots=True)
class BatchDecision:
    """Whether a shared model batches, on which backend, and why.

    Attributes:
        batch: Frames of several pipelines run as one batch.
        size: Frames per batch (0 when not batching for a reason found before measuring).
        min_frames: The fewest waiting frames worth a batch (the rest padded with copies):
            ``ceil(size / speedup)``, at least 2.
        reason: Why, in words.
        backend: The backend configuration measured (``onnxruntime CPUExecutionProvider``).
        measurement: What was measured (``None`` when nothing was).
    """

    batch: bool
    size: int
    reason: str
    min_frames: int = 0
    backend: str = ""
    measurement: BatchMeasurement | None = None

    @property
    def mode(self) -> str:
        return "batch" if self.batch else "round-robin"

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "size": self.size, "min_frames": self.min_frames,
                "reason": self.reason, "backend": self.backend,
                "measurement": None if self.measurement is None else self.measurement.to_dict()}


def round_robin(reason: str, size: int = 0, backend: str = "",
                measurement: BatchMeasurement | None = None) -> BatchDecision:
    """A decision not to batch."""
    return BatchDecision(False, size, reason, backend=backend, measurement=measurement)


def decide(policy: BatchPolicy, measurement: BatchMeasurement, backend: str = "",
           tolerance: float = 1e-3) -> BatchDecision:
    """Batch or not, from the measurement: ``auto`` batches at >= ``SPEEDUP``; ``fixed``
    batches unless the rows differ from single runs; a batch whose rows differ from single
    runs (more than ``tolerance`` of the output's range) is never used."""
    m, size = measurement, measurement.size
    if m.max_diff > tolerance:
        return round_robin(f"a batch's rows differ from single runs by {m.max_diff:.2g} of the "
                           f"output range (over {tolerance:g})", size, backend, m)
    if policy.mode == "fixed":
        note = "" if m.speedup >= SPEEDUP else " (slower than one by one; batch: auto would not)"
        return BatchDecision(True, size, f"batch: {size} in the config, {m.speedup:.2f}x{note}",
                             2, backend, m)
    if m.speedup < SPEEDUP:
        return round_robin(f"batch of {size} is {m.speedup:.2f}x one by one, under "
                           f"{SPEEDUP}x", size, backend, m)
    if not m.consistent:
        return round_robin(f"batch of {size} is {m.speedup:.2f}x one by one, but only "
                           f"{m.faster_rounds} of {m.rounds} rounds were >= {SPEEDUP}x (a busy "
                           "box: measured again when the sharers or the backend change)",
                           size, backend, m)
    least = max(2, min(size, math.ceil(size / m.speedup - 1e-9)))
    return BatchDecision(True, size, f"batch of {size} is {m.speedup:.2f}x one by one",
                         least, backend, m)


def refusal(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
            graph_inputs: Mapping[str, Sequence[Dim]]) -> str | None:
    """Why a model cannot be batched (``None``: it can be tried). Every input must have a
    symbolic first dimension in the file (a fixed batch, even 1, is the exporter's choice)
    served as 1, every tensor a numeric tensor of rank >= 1; outputs are checked on the batch
    session itself (``split``)."""
    if not inputs or not outputs:
        return "the model has no inputs or no outputs"
    for spec in inputs:
        declared = graph_inputs.get(spec.name, spec.shape)
        if not declared or len(spec.shape) == 0:
            return f"input {spec.name!r} is a scalar: no batch dimension"
        first = declared[0]
        if isinstance(first, int) and first > 0:
            return (f"input {spec.name!r} has a fixed first dimension {first} in the file "
                    "(a static batch); export it with a dynamic batch to batch it")
        if spec.shape[0] not in (1, None) and not isinstance(spec.shape[0], str):
            return f"input {spec.name!r} is served with a first dimension of {spec.shape[0]}"
        if not all(isinstance(d, int) and d > 0 for d in spec.shape[1:]):
            return (f"input {spec.name!r} is served as {list(spec.shape)}: dimensions besides "
                    "the batch must be fixed (model.input_shapes)")
        if spec.quantization is not None or not spec.dtype.startswith(("float", "int", "uint")):
            return f"input {spec.name!r} is {spec.dtype} (quantized or not a numeric tensor)"
    return None


def row_key(feeds: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """What frames stacked into one batch must share: names, shapes and dtypes."""
    return tuple(sorted((k, v.shape, v.dtype.str) for k, v in feeds.items()))


def stack(rows: Sequence[Mapping[str, np.ndarray]], size: int) -> Feeds:
    """One batch of ``size`` from ``rows`` (each a frame's feeds with a first dimension of 1,
    all of one ``row_key``), padded with copies of the last row."""
    pad = size - len(rows)
    out: Feeds = {}
    for name in rows[0]:
        parts = [r[name] for r in rows]
        if pad > 0:
            parts.extend([parts[-1]] * pad)
        out[name] = np.concatenate(parts, axis=0)
    return out


def split(outputs: Mapping[str, np.ndarray], count: int, size: int) -> list[Feeds]:
    """Each of the first ``count`` rows of a batch's outputs, as a single run gives them
    (first dimension 1). Views, not copies.

    Raises:
        ValueError: an output's first dimension is not the batch (not per-row outputs).
    """
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != size:
            raise ValueError(f"output {name!r} has shape {list(value.shape)}: its first "
                             f"dimension is not the batch of {size}")
    return [{k: v[i:i + 1] for k, v in outputs.items()} for i in range(count)]


def difference(single: Mapping[str, np.ndarray], row: Mapping[str, np.ndarray]) -> float:
    """The largest difference between two runs' outputs, relative to each output's range."""
    worst = 0.0
    for name, a in single.items():
        b = row.get(name)
        if b is None or b.shape != a.shape:
            return math.inf
        if a.size == 0:
            continue
        x, y = a.astype(np.float64), b.astype(np.float64)
        span = float(np.ptp(x)) or 1.0
        worst = max(worst, float(np.max(np.abs(x - y))) / span)
    return worst


def check_rows(run_single: Callable[[Feeds], Feeds], run_batch: Callable[[Feeds], Feeds],
               row: Feeds, size: int) -> float:
    """Run ``row`` alone and ``size`` copies of it as one batch; the largest difference
    between a batch row and the single run (``difference``).

    Raises:
        ValueError: the batch's outputs are not per-row (``split``).
        What the runs raise.
    """
    reference = run_single(row)
    return max(difference(reference, r) for r in split(run_batch(stack([row], size)), size, size))


def measure(run_single: Callable[[Feeds], Feeds], run_batch: Callable[[Feeds], Feeds],
            row: Feeds, size: int, *, max_diff: float = 0.0, rounds: int = ROUNDS,
            budget_s: float = MEASURE_BUDGET_S) -> BatchMeasurement:
    """Time ``size`` single runs of ``row`` against one batch of ``size`` copies of it,
    interleaved (the order alternating each round, so load hits both alike), for ``rounds``
    rounds or ``budget_s`` (at least ``MIN_ROUNDS``), and count the rounds that were
    ``SPEEDUP`` faster on their own. ``max_diff``: what ``check_rows`` found.

    Raises:
        What the runs raise.
    """
    batch = stack([row], size)
    singles: list[float] = []
    batches: list[float] = []
    deadline = time.perf_counter() + budget_s
    for i in range(rounds):
        if i >= MIN_ROUNDS and time.perf_counter() > deadline:
            break
        for first_batch in ((True, False) if i % 2 else (False, True)):
            t0 = time.perf_counter()
            if first_batch:
                run_batch(batch)
                batches.append(time.perf_counter() - t0)
            else:
                for _ in range(size):
                    run_single(row)
                singles.append((time.perf_counter() - t0) / size)
    faster = sum(size * one >= SPEEDUP * b for one, b in zip(singles, batches, strict=True))
    return BatchMeasurement(size, statistics.median(singles) * 1000,
                            statistics.median(batches) * 1000, len(batches), max_diff, faster)
