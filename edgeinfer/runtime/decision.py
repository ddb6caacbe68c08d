"""The backend selector's decision: its table, and its cache in the state directory.

A decision is keyed by the model's sha256, the backends' versions, the CPU and its features and
the load options, so it is reused only where it was measured; written atomically as JSON in
``<state_dir>/select/<key>.json``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .backends import BACKENDS, decision_key
from .base import Choice, SessionSpec
from .busy import Load
from .providers import cpu_features, cpu_features_digest, detect_platform

logger = logging.getLogger(__name__)

# 2: the gate judges on photos through the task's preprocessing with a noise floor, and never on
# a guessed input size (issue 30): picks cached by version 1 refused right candidates on outputs
# near zero, so every device measures each model once more.
SELECTOR_VERSION = 2
DEFAULT_BUDGET_S = 15.0


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
    final: bool = False  # timed again among the finalists, interleaved

    def to_dict(self) -> dict[str, Any]:
        return {"choice": self.choice.to_dict(), "label": self.choice.label(),
                "status": self.status, "p50_ms": _r(self.p50_ms), "p99_ms": _r(self.p99_ms),
                "runs": self.runs, "load_ms": _r(self.load_ms), "mib": _r(self.mib),
                "accuracy": self.accuracy, "reason": self.reason, "final": self.final}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Row:
        return cls(Choice.from_dict(d["choice"]), str(d.get("status", "")), d.get("p50_ms"),
                   d.get("p99_ms"), int(d.get("runs") or 0), d.get("load_ms"), d.get("mib"),
                   str(d.get("accuracy", "")), str(d.get("reason", "")),
                   final=bool(d.get("final", False)))


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
    load: Load | None = None  # other processes' share of the CPUs while measuring
    under_load: bool = False  # measured while load.others >= busy_share: provisional
    rechecks: int = 0  # times measured again after the first measurement
    recheck_note: str = ""  # what the last re-check found
    stable: bool = True  # the finalists' ranking settled before the budget ended (not cached)
    # loads that measured a provisional decision again and found the box busy meanwhile, and
    # when the last did (``provisional.py``: no re-measuring in a loop on a busy box)
    tries: int = 0
    tried_at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"version": SELECTOR_VERSION, "choice": self.choice.to_dict(),
                "picked": self.choice.label(), "provider": self.choice.provider,
                "gate": self.gate, "inputs": self.inputs, "key": self.key,
                "created": self.created, "elapsed_s": round(self.elapsed_s, 2),
                "budget_s": self.budget_s, "cached": self.cached, "note": self.note,
                "measured_under_load": self.under_load,
                "load": self.load.to_dict() if self.load is not None else None,
                "rechecks": self.rechecks, "recheck": self.recheck_note,
                "provisional": self.under_load, "state": self.state(),
                "provisional_tries": self.tries, "provisional_tried_at": round(self.tried_at, 3),
                "platform": describe_platform(),
                "candidates": [r.to_dict() for r in self.rows]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        if d.get("version") != SELECTOR_VERSION:
            raise ValueError("written by another selector version")
        load = d.get("load")
        return cls(Choice.from_dict(d["choice"]), [Row.from_dict(r) for r in d["candidates"]],
                   str(d["gate"]), str(d.get("inputs", "")), str(d.get("key", "")),
                   float(d.get("created", 0)), float(d.get("elapsed_s", 0)),
                   float(d.get("budget_s", DEFAULT_BUDGET_S)), True, str(d.get("note", "")),
                   Load.from_dict(load) if isinstance(load, Mapping) else None,
                   bool(d.get("measured_under_load", False)), int(d.get("rechecks") or 0),
                   str(d.get("recheck") or ""), tries=int(d.get("provisional_tries") or 0),
                   tried_at=float(d.get("provisional_tried_at") or 0.0))

    def mark_load(self, load: Load | None, busy_share: float) -> None:
        """Record the load this decision was measured under: ``measured_under_load`` when
        other processes used ``busy_share`` of the CPUs or more (provisional)."""
        self.load = load
        self.under_load = load is not None and load.others >= busy_share

    def load_note(self) -> str:
        """``measured under load (other processes used 48 % of 2 CPUs): provisional``, or ""."""
        if self.load is None or not self.under_load:
            return ""
        return f"measured under load ({self.load.describe()}): provisional"

    def state(self) -> str:
        """Whether the decision is final, for ``edgeinfer info``: ``provisional: measured under
        load (other processes used 64 % of 2 CPUs) at 05:12:09; ...`` or ``final: measured
        with other processes at 3 % of 2 CPUs``."""
        if self.under_load and self.load is not None:
            when = time.strftime(" at %Y-%m-%d %H:%M:%S", time.localtime(self.created)) \
                if self.created else ""
            tried = ""
            if self.tries:
                tried = (f"; {self.tries} more tries ran into load (last at "
                         f"{time.strftime('%H:%M:%S', time.localtime(self.tried_at))})")
            return (f"provisional: measured under load ({self.load.describe()}){when}{tried}; "
                    "a load on a quiet box measures it again")
        if self.load is not None:
            again = f", re-checked {self.rechecks}x" if self.rechecks else ""
            return (f"final: measured with other processes at {self.load.others * 100:.0f} % of "
                    f"{self.load.cpus} CPUs{again}")
        return "final"

    def picked_row(self) -> Row | None:
        """The picked candidate's row."""
        return next((r for r in self.rows if r.status == "picked"), None)

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
        if self.note.startswith("not measured"):
            return f"{self.choice.label()} ({self.note[:200]})"
        how = "cached decision" if self.cached else f"measured in {self.elapsed_s:.1f} s"
        if self.rechecks:
            how += f", re-checked {self.rechecks}x"
        note = "".join(f"; {n}" for n in (self.note, self.load_note(), self.recheck_note) if n)
        return (f"{self.choice.label()}{speed}{gain} ({how}: {n_ok} correct, {n_bad} refused of "
                f"{len(self.rows)} candidates, gate {self.gate}, {self.inputs}{note})")


def _r(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def _baseline(rows: Sequence[Row]) -> Row | None:
    ort = [r for r in rows if r.choice.backend == "onnxruntime" and r.p50_ms is not None
           and r.status in ("ok", "picked")]
    return min(ort, key=lambda r: r.p50_ms or math.inf) if ort else None


@functools.cache
def _dist_infos() -> dict[str, str]:
    """Installed distributions -> version, from the ``*.dist-info`` folder names on
    ``sys.path`` (the first found wins, as for imports). ``importlib.metadata`` would cost a
    cached boot 16 ms of imports (email, zipfile, lzma...) for the same five names."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if n.endswith(".dist-info") and "-" in n:
                dist, _, version = n[: -len(".dist-info")].rpartition("-")
                found.setdefault(_normalized(dist), version)
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (``None``: not installed)."""
    return _dist_infos().get(_normalized(name))


def _versions() -> dict[str, str | None]:
    """Each backend's distributions (its row in the table) -> the installed version. With the
    four built-in rows exactly the five distributions keys always held, so a device's cached
    decisions stay found after an upgrade of edgeinfer."""
    return {d: dist_version(d) for row in BACKENDS.values() for d in row.dists}


def cache_key(spec: SessionSpec, gate_key: str) -> str:
    """The decision's key: model, backend versions, CPU and its features, the options (each
    backend's own, as it says: LiteRT's delegates)."""
    platform = detect_platform()
    parts: dict[str, Any] = {
        "v": SELECTOR_VERSION, "sha256": spec.sha256, "format": spec.format,
        "versions": _versions(), "machine": platform.machine, "cpu": platform.cpu_model,
        "features": cpu_features_digest(), "threads": spec.threads,
        "providers": list(spec.providers), "precision": spec.precision,
        "shapes": {k: list(v) for k, v in sorted(spec.input_shapes.items())}, "gate": gate_key,
        "memory_limit_mb": spec.memory_limit_mb, "armnn": _armnn_version(),
    }
    own = decision_key(spec)
    if set(own) & set(parts):
        raise ConfigError(f"a backend's options name decision key parts the selector's own "
                          f"use: {sorted(set(own) & set(parts))}")
    parts.update(own)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _armnn_version() -> str | None:
    # Debian's python3-pyarmnn has no distribution metadata (its row names no dists)
    return "present" if importlib.util.find_spec("pyarmnn") is not None else None


def cache_path(spec: SessionSpec, key: str) -> Path | None:
    return spec.state_dir / "select" / f"{key}.json" if spec.state_dir is not None else None


def read_cached(spec: SessionSpec, gate_key: str) -> tuple[Decision, Path] | None:
    """The decision file for ``spec`` under ``gate_key`` and where it lies, or None (none, or
    unreadable). Only reads: whether its choice may be opened is the selector's question
    (``select.load_cached``)."""
    key = cache_key(spec, gate_key)
    path = cache_path(spec, key)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return Decision.from_dict(json.load(f)), path
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


def describe_platform() -> dict[str, Any]:
    """What the decision depends on, for ``edgeinfer info``."""
    p = detect_platform()
    feats = cpu_features()
    keys = sorted(f for f in feats if f.startswith(("avx512", "amx", "avx_vnni", "asimd", "fphp",
                                                     "bf16", "i8mm", "sve")) or f in ("avx2",
                                                                                      "fma"))
    return {"machine": p.machine, "cpu": p.cpu_model, "features": keys,
            "versions": {k: v for k, v in _versions().items() if v}}
