"""Boot probe: run a fixed input on each working provider, reject the wrong ones, keep the fastest.

The decision is cached in the state directory, keyed by model sha256, onnxruntime version, CPU
model, available providers and threads, so a reboot does not re-probe.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import EdgeInferError, InvalidInputError
from .base import Fallback, LoadReport, SessionSpec, warmup_feeds
from .ort_types import spec_of
from .providers import CPU, Candidate, PlatformInfo

logger = logging.getLogger(__name__)

RUNS = 10
RTOL = 2e-2  # relative to the largest CPU output value: FP16 TensorRT must pass, a broken EP not
ATOL = 1e-3

Creator = Callable[[Any, SessionSpec, Candidate, LoadReport], Any]


def order_by_probe(
    ort: Any,
    spec: SessionSpec,
    candidates: list[Candidate],
    platform: PlatformInfo,
    report: LoadReport,
    create: Creator,
) -> list[Candidate]:
    """Return ``candidates`` reordered: the fastest correct provider first, CPU last."""
    key = _key(ort, spec, candidates, platform)
    path = spec.state_dir / "probe" / f"{key}.json" if spec.state_dir else None
    cached = _read(path)
    if cached is not None:
        report.probe = {**cached, "cached": True}
        return _reorder(candidates, cached["order"])
    result = _probe(ort, spec, candidates, report, create)
    report.probe = {**result, "cached": False}
    if path is not None:
        _write(path, result)
    return _reorder(candidates, result["order"])


def _probe(
    ort: Any, spec: SessionSpec, candidates: list[Candidate], report: LoadReport, create: Creator
) -> dict[str, Any]:
    scratch = LoadReport()
    ref_sess = create(ort, spec, Candidate(CPU, {}), scratch)
    specs = tuple(spec_of(a, {}) for a in ref_sess.get_inputs())
    try:
        base, _ = warmup_feeds(specs, spec.input_shapes, spec.warmup_inputs)
    except InvalidInputError as exc:  # no input can be made up: keep the ranked order
        logger.warning("provider probe skipped for %s: %s", spec.path.name, exc)
        return {"order": [c.name for c in candidates], "median_ms": {}, "rejected": {},
                "runs": 0, "skipped": str(exc)}
    rng = np.random.default_rng(0)
    feeds = {  # random floats exercise the provider more than zeros; declared values stay
        n: rng.random(v.shape, dtype=np.float32).astype(v.dtype)
        if v.dtype.kind == "f" and n not in spec.warmup_inputs else v
        for n, v in base.items()
    }
    reference = ref_sess.run(None, feeds)
    timings: dict[str, float] = {}
    rejected: dict[str, str] = {}
    for cand in candidates:
        try:
            sess = ref_sess if cand.name == CPU else create(ort, spec, cand, scratch)
            if sess.get_providers()[0] != cand.name:
                rejected[cand.name] = f"fell back to {sess.get_providers()[0]}"
                continue
            out = sess.run(None, feeds)
            bad = _mismatch(out, reference)
            if bad:
                rejected[cand.name] = bad
                report.fallbacks.append(Fallback(cand.name, f"probe rejected it: {bad}"))
                logger.warning("probe rejected %s: %s", cand.name, bad)
                continue
            times = []
            for _ in range(RUNS):
                t = time.perf_counter()
                sess.run(None, feeds)
                times.append((time.perf_counter() - t) * 1000)
            timings[cand.name] = statistics.median(times)
        except (EdgeInferError, RuntimeError) as exc:
            rejected[cand.name] = str(exc)
    order = sorted(timings, key=timings.__getitem__)
    return {"order": order, "median_ms": timings, "rejected": rejected, "runs": RUNS}


def _mismatch(out: list[np.ndarray], ref: list[np.ndarray]) -> str:
    for i, (a, b) in enumerate(zip(out, ref)):
        if a.shape != b.shape:
            return f"output {i} shape {a.shape} != CPU {b.shape}"
        if a.dtype.kind == "f":
            scale = float(np.max(np.abs(b))) if b.size else 0.0
            err = float(np.max(np.abs(a.astype(np.float64) - b))) if b.size else 0.0
            if not np.isfinite(err) or err > ATOL + RTOL * scale:
                return f"output {i} differs from CPU by {err:.3g} (tolerance {ATOL + RTOL * scale:.3g})"
        elif not np.array_equal(a, b):
            return f"output {i} differs from CPU"
    return ""


def _reorder(candidates: list[Candidate], order: list[str]) -> list[Candidate]:
    by_name = {c.name: c for c in candidates}
    ranked = [by_name[n] for n in order if n in by_name]
    if not any(c.name == CPU for c in ranked) and CPU in by_name:
        ranked.append(by_name[CPU])
    return ranked or candidates


def _key(ort: Any, spec: SessionSpec, candidates: list[Candidate], platform: PlatformInfo) -> str:
    parts = [spec.sha256, ort.__version__, platform.cpu_model, platform.machine,
             ",".join(c.name for c in candidates), str(spec.threads),
             json.dumps(dict(spec.input_shapes), sort_keys=True)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def _read(path: Any) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) and isinstance(data.get("order"), list) else None
    except (OSError, ValueError):
        return None


def _write(path: Any, data: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("could not cache the provider probe in %s: %s", path, exc)
