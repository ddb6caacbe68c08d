"""The batch side of a shared model (``model/pool.py``): whether its sharers' frames run as one
batch on this backend, and the batch session that runs them.

A ``Batcher`` belongs to one pooled model. The model's inference thread asks it, before
serving, whether a decision is due (``due``): two or more sharers, backend measuring over, and
the backend or the number of sharers changed since the last decision (settled for a second, so
pipelines starting one after another cost one measurement). ``decide`` then opens a second
session on the same backend configuration with the batch dimension fixed to B (B = sharers,
at most 8, or the ``batch: N`` of the config), times B single runs of a real waiting frame
against one batch of B, interleaved, checks each row against the single run, and keeps the
batch session only where ``runtime.batching.decide`` says so (>= 1.1x). The decision and its
measurement are logged once and shown in ``SharedModel.shared_stats()`` (the stats topic).
A model that cannot batch (a static batch in the file, scalar inputs, a stateful task,
``isolation: process``) gets a round-robin decision with the reason, and nothing is measured.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import EdgeInferError
from ..runtime.base import check_feeds
from ..runtime.batching import (
    MAX_AUTO,
    SPEEDUP,
    BatchDecision,
    BatchPolicy,
    Feeds,
    check_rows,
    decide,
    measure,
    refusal,
    round_robin,
    row_key,
    split,
    stack,
)
from .load import open_model
from .model import Model

logger = logging.getLogger("edgeinfer.sharing")

SETTLE_S = 1.0  # the sharers and backend must hold this long before a decision is measured
LIVE_BATCHES = 16  # auto checks the cost per frame of this many live batches once

RowKey = tuple[tuple[str, tuple[int, ...], str], ...]


class Batcher:
    """Decides and runs the batches of one pooled model; used by its inference thread only
    (``decide`` and ``run`` under the model's run lock).

    Attributes:
        policy: The config's ``batch`` and ``batch_window_ms``.
        decision: The current decision (round-robin until one is measured).
        batches: Batches run; ``frames``: frames they carried (padding not counted).
        failures: Batches that raised (their frames were retried one by one).
    """

    def __init__(self, model: Model, policy: BatchPolicy) -> None:
        self.model = model
        self.policy = policy
        self.batches = 0
        self.frames = 0
        self.failures = 0
        self.last_error = ""
        self._variant: Model | None = None
        self._decided: tuple[int, int] | None = None  # (model generation, batch) decided for
        self._seen: tuple[tuple[int, int], float] | None = None  # the key and since when
        self._row: RowKey | None = None
        self._live: list[float] = []  # ms per frame of the live batches since the decision
        self.live_ms = 0.0  # their median, once LIVE_BATCHES ran
        refused = self._refusal()
        self.decision = round_robin(refused or "not decided: fewer than 2 sharers yet")
        self._refused = refused is not None
        self._told = False  # the refusal logged (once, when sharing starts)

    def _refusal(self) -> str | None:
        if self.policy.mode == "off":
            return self.policy.reason or "batch: off in the config"
        m = self.model
        if m.worker_pid is not None:
            return "isolation: process runs one frame at a time in its worker"
        if m.report.choice is None:
            return f"the backend {m.provider} does not say its configuration"
        return refusal(m.inputs, m.outputs, m.spec.graph_inputs)

    def size(self, sharers: int) -> int:
        """B for this many sharers."""
        if self.policy.mode == "fixed":
            return self.policy.size
        return min(sharers, MAX_AUTO)

    def due(self, sharers: int) -> bool:
        """Whether ``decide`` should run now (cheap; called before each serve)."""
        if self._refused or sharers < 2 or self.model.selecting:
            if self._refused and sharers >= 2 and not self._told:
                self._told = True
                logger.log(logging.WARNING if self.policy.mode == "fixed" else logging.INFO,
                           "model %s: its sharers' frames run one by one: %s",
                           self.model.name, self.decision.reason)
            return False
        key = (self.model.generation, self.size(sharers))
        if key == self._decided:
            return False
        now = time.monotonic()
        if self._seen is None or self._seen[0] != key:
            self._seen = (key, now)
        return now - self._seen[1] >= SETTLE_S

    @property
    def limit(self) -> int:
        """The most frames to gather for one run (1: round-robin)."""
        ok = self._variant is not None and self._decided is not None \
            and self._decided[0] == self.model.generation
        return self.decision.size if ok and self.decision.batch else 1

    @property
    def min_frames(self) -> int:
        return self.decision.min_frames

    def decide(self, sharers: int, sample: Any) -> None:
        """Open the batch session for the current backend and B, measure it against single
        runs of ``sample`` (a waiting frame's feeds), keep it or not. Never raises: a failure
        is a round-robin decision with its reason. A sample that does not fit the model (its
        own run will say why) is not measured with: the next frame is."""
        row = self.row_of(sample)
        if row is None:
            return
        size = self.size(sharers)
        key = (self.model.generation, size)
        self._decided, self._seen = key, None
        self._close_variant()
        self._live, self.live_ms = [], 0.0
        choice = self.model.report.choice
        backend = choice.label() if choice is not None else self.model.provider
        try:
            variant = self._open(size)
        except (EdgeInferError, ValueError) as exc:
            self._set(round_robin(f"the batch session did not open: {exc}", size, backend))
            return
        try:
            diff = check_rows(self.model.run, variant.run, row, size)
            given = self.policy.measurement
            m = measure(self.model.run, variant.run, row, size, max_diff=diff) \
                if given is None else replace(given, size=size, max_diff=diff,
                                              batch_ms=given.batch_ms * size / given.size)
            decision = decide(self.policy, m, backend)
        except (EdgeInferError, ValueError) as exc:
            decision = round_robin(f"a batch of {size} did not run: {exc}", size, backend)
        if decision.batch:
            self._variant, self._row = variant, row_key(row)
        else:
            variant.close()
        self._set(decision)

    def row_of(self, sample: Any) -> Feeds | None:
        """``sample`` checked as a single frame of the model's served shapes, else ``None``."""
        try:
            row = check_feeds(self.model.inputs, sample)
        except EdgeInferError:
            return None
        try:
            return row if row_key(row) == self._expected() else None
        except AttributeError:  # a value that is not an array
            return None

    def _expected(self) -> RowKey:
        return tuple(sorted((s.name, (1, *(int(d) for d in s.shape[1:] if isinstance(d, int))),
                             np.dtype(s.dtype).str) for s in self.model.inputs))

    def _open(self, size: int) -> Model:
        m = self.model
        shapes = {s.name: (size, *(int(d) for d in s.shape[1:] if isinstance(d, int)))
                  for s in m.inputs}
        spec = m.spec.replace(input_shapes=shapes, choice=m.report.choice, probe=False,
                              warmup=True)
        variant = open_model(spec, m.file_info, f"{m.name}[batch {size}]", m.version)
        if [s.name for s in variant.outputs] != [s.name for s in m.outputs]:
            variant.close()
            raise ValueError("the batch session names its outputs differently")
        return variant

    def _set(self, decision: BatchDecision) -> None:
        self.decision = decision
        asked = self.policy.mode == "fixed" and not decision.batch
        logger.log(logging.WARNING if asked else logging.INFO, "model %s: %s on %s: %s",
                   self.model.name,
                   f"batches of {decision.size}" if decision.batch else "round-robin",
                   decision.backend, decision.reason)

    # -- running ----------------------------------------------------------------------------------
    def row(self, feeds: Any) -> Feeds | None:
        """A frame's feeds as a batch row, or ``None`` when they do not fit the batch (another
        shape or dtype: the frame runs on its own, where its error, if any, is raised)."""
        if isinstance(feeds, np.ndarray) and len(self.model.inputs) == 1:
            feeds = {self.model.inputs[0].name: feeds}
        if not isinstance(feeds, Mapping):
            return None
        try:
            key = row_key(feeds)
        except AttributeError:  # a value that is not an array
            return None
        return dict(feeds) if key == self._row else None

    def run(self, rows: Sequence[Feeds]) -> list[Feeds]:
        """Run ``rows`` as one batch (padded to B); each row's outputs.

        Raises:
            What the batch session raises; ValueError if its outputs are not per-row.
        """
        variant = self._variant
        if variant is None:
            raise ValueError("no batch session")
        size = self.decision.size
        t0 = time.perf_counter()
        out = split(variant.run(stack(rows, size)), len(rows), size)
        self.batches += 1
        self.frames += len(rows)
        if len(self._live) < LIVE_BATCHES:
            self._live.append((time.perf_counter() - t0) * 1000 / len(rows))
            if len(self._live) == LIVE_BATCHES:
                self._check_live()
        return out

    def _check_live(self) -> None:
        """The live batches against the measurement: what the waiting frames really cost a
        batch (padding, a busier box) is not what B copies cost. ``auto`` goes back to
        round-robin when a frame in a live batch costs more than 1 / ``SPEEDUP`` of a single
        run as measured."""
        self.live_ms = statistics.median(self._live)
        d, m = self.decision, self.decision.measurement
        if self.policy.mode != "auto" or m is None or self.live_ms * SPEEDUP <= m.single_ms:
            return
        self._close_variant()
        self._set(round_robin(f"live batches of {d.size} cost {self.live_ms:.2f} ms a frame, "
                              f"not {SPEEDUP}x under the {m.single_ms:.2f} ms of one frame "
                              "alone as measured", d.size, d.backend, m))

    def failed(self, exc: BaseException) -> None:
        """A batch raised: its frames are retried one by one (counted, logged the first time)."""
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.failures == 1:
            logger.warning("model %s: a batch failed (%s); its frames ran one by one",
                           self.model.name, self.last_error)

    def stats(self) -> dict[str, Any]:
        """The decision and the counters, for ``shared_stats``."""
        return {**self.decision.to_dict(), "policy": self.policy.describe(),
                "batches": self.batches, "batched_frames": self.frames,
                "live_ms_per_frame": round(self.live_ms, 3),
                "failures": self.failures, "last_error": self.last_error}

    def _close_variant(self) -> None:
        variant, self._variant, self._row = self._variant, None, None
        if variant is not None:
            variant.close()

    def close(self) -> None:
        self._close_variant()
