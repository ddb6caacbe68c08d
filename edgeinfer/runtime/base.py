"""What every runtime backend provides: the ``Session`` protocol and the values around it.

A backend (a module in ``runtime/backends/``, listed in its one table; ``runtime/worker.py`` for
an isolated process) turns a model file and ``SessionSpec`` into a ``Session``.
``edgeinfer.model.Model`` is the public face over any of them; it never knows which backend it
holds.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ..errors import InferenceError, InvalidInputError, ModelLoadError, ModelMemoryError
from .busy import RecheckSettings
from .choice import PRECISIONS, Choice

__all__ = ["PRECISIONS", "Choice", "DelegateSpec", "Dim", "Fallback", "LoadReport", "Session",
           "SessionSpec", "TensorSpec", "check_feeds", "format_shape", "is_tensor", "numpy_dtype",
           "warm_up", "warmup_feeds"]

logger = logging.getLogger(__name__)

Dim = int | str | None
"""A tensor dimension: an int when fixed, a symbolic name or None when dynamic."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Name, shape and dtype of one model input or output.

    ``quantization`` is ``(scale, zero_point)`` for a quantized TFLite tensor whose values the
    session converts to and from float for the caller; ``None`` otherwise.
    """

    name: str
    shape: tuple[Dim, ...]
    dtype: str
    quantization: tuple[float, int] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.quantization is not None:
            d["quantization"] = {"scale": self.quantization[0], "zero_point": self.quantization[1]}
        return d


@dataclass(frozen=True, slots=True)
class DelegateSpec:
    """A TFLite external delegate: a shared library and its options (LiteRT's own option,
    ``backends.tflite.LiteRTOptions``; named here, where ``load_model``'s keywords find it)."""

    library: str
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """Everything a backend needs to build a session, resolved by ``load_model``.

    Attributes:
        path: the model file (already checked to exist, be of ``format`` and be safe).
        format: ``"onnx"`` or ``"tflite"``, detected from the file's bytes.
        sha256: hex digest of the model file, the key of every cache.
        threads: intra-op threads (ONNX) or ``num_threads`` (TFLite).
        providers: ``("auto",)`` or the provider names/aliases wanted, best first.
        strict_providers: a fallback away from the first wanted provider is an error.
        probe: measure the candidate backends at load and keep the fastest correct one
            (``runtime/select.py``; the decision is cached in ``state_dir``).
        input_shapes: fixed shapes for inputs with dynamic dimensions (also used for warm-up).
        input_shapes_from: where ``input_shapes`` came from, in words (``"the model's metadata
            (imgsz)"``), for what ``info`` and the selector's decision say.
        memory_limit_mb: the per-model limit (``None``: none).
        cache_dir: where the optimized-model cache lives; ``None`` turns it off.
        state_dir: TensorRT engine/timing caches and backend decisions.
        dequantize_outputs: return float outputs for quantized TFLite output tensors.
        warmup: run one inference before the session is handed out.
        graph_inputs: input name -> dims as the model file declares them (symbolic names kept),
            from the file inspection; lets a backend fix named dynamic dimensions.
        external_data: the ONNX model keeps weights in files beside it (not cached: the
            optimized copy would duplicate them on the device's storage).
        warmup_inputs: values for the warm-up run by input name (scalars are broadcast);
            inputs not named get zeros. For models where zeros are not a valid input; see
            :func:`warm_up` for when a failed warm-up refuses the model.
        choice: open exactly this backend configuration (set by the measuring selector in
            ``runtime/select.py`` or from its cached decision); ``None``: the backend for
            ``format`` picks by its own ranking (``providers``).
        precision: the lowest arithmetic the selector may choose (see ``PRECISIONS``).
        probe_budget_s: how long measuring the candidates may take on a first load.
        recheck: when a decision counts as measured under load and when it is measured again
            (``busy.RecheckSettings``).
        options: each backend's own options by backend name: the struct its module defines
            (``onnxruntime``: ``OnnxOptions`` with ``arena``; ``litert``: ``LiteRTOptions`` with
            ``delegates``), built by ``backends.backend_options``; a backend not named here
            runs with its defaults.
    """

    path: Path
    format: str
    sha256: str
    threads: int
    providers: tuple[str, ...] = ("auto",)
    strict_providers: bool = False
    probe: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    input_shapes_from: str = ""
    memory_limit_mb: float | None = None
    cache_dir: Path | None = None
    state_dir: Path | None = None
    dequantize_outputs: bool = True
    warmup: bool = True
    graph_inputs: Mapping[str, tuple[Dim, ...]] = field(default_factory=dict)
    external_data: bool = False
    warmup_inputs: Mapping[str, Any] = field(default_factory=dict)
    choice: Choice | None = None
    precision: str = "fp16"
    probe_budget_s: float = 15.0
    recheck: RecheckSettings = RecheckSettings()
    options: Mapping[str, Any] = field(default_factory=dict)

    def replace(self, **changes: Any) -> SessionSpec:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Fallback:
    """A provider (or delegate) that was asked for and is not the one running, and why."""

    provider: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"provider": self.provider, "reason": self.reason}


@dataclass(slots=True)
class LoadReport:
    """How a session came to be: filled in by the backend while loading, read by ``Model``."""

    backend: str = ""
    provider: str = ""
    requested: tuple[str, ...] = ()
    fallbacks: list[Fallback] = field(default_factory=list)
    cache: str = "off"  # "hit" | "miss" | "off" | "error"
    probe: dict[str, Any] | None = None
    warmed_up: bool = False
    warmup_note: str = ""
    load_ms: float = 0.0
    warmup_ms: float = 0.0
    rss_load_mb: float = 0.0
    rss_first_run_mb: float = 0.0
    isolation: str = "none"
    choice: Choice | None = None
    selection: dict[str, Any] | None = None  # the measuring selector's decision and table

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["requested"] = list(self.requested)
        return d


class Session(Protocol):
    """A loaded model that can run. Backends implement this; ``Model`` wraps it.

    ``run`` takes feeds already checked by :func:`check_feeds` and returns every output by name.
    ``close`` is idempotent.
    """

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    report: LoadReport

    @property
    def provider(self) -> str: ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


def check_feeds(
    specs: tuple[TensorSpec, ...],
    feeds: Mapping[str, Any] | np.ndarray,
    *,
    accept_float_for_quantized: bool = False,
) -> dict[str, np.ndarray]:
    """Check ``feeds`` against the model's inputs and return them as a dict of arrays.

    A bare ndarray is accepted for a single-input model. Names must match exactly; rank and fixed
    dimensions must match; dtypes must match (no silent per-frame conversion), except that float
    input is accepted for a quantized input when the backend converts it itself.

    Raises:
        InvalidInputError: with what was expected and what was given.
    """
    if isinstance(feeds, np.ndarray):
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise InvalidInputError(
                f"a bare array was given but the model has {len(specs)} inputs ({names}); "
                "pass a dict of name -> array"
            )
        feeds = {specs[0].name: feeds}
    elif not isinstance(feeds, Mapping):
        raise InvalidInputError(
            f"inputs must be a dict of name -> numpy array, got {type(feeds).__name__}"
        )
    expected = {s.name for s in specs}
    given = set(feeds)
    if given != expected:
        missing = sorted(expected - given)
        unknown = sorted(given - expected)
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unknown {unknown}")
        raise InvalidInputError(
            f"wrong input names: {', '.join(parts)}; the model takes {sorted(expected)}"
        )
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        value = feeds[spec.name]
        if not is_tensor(spec.dtype):  # a sequence, optional or map: onnxruntime checks it
            out[spec.name] = value
            continue
        want = numpy_dtype(spec.dtype)
        if not isinstance(value, np.ndarray):
            if not isinstance(value, (int, float, bool, str, list, tuple, np.generic)):
                raise InvalidInputError(
                    f"input {spec.name!r}: expected a numpy array, got {type(value).__name__}"
                )
            try:
                value = np.asarray(value, dtype=want)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"input {spec.name!r}: cannot be made a {spec.dtype} array: {exc}"
                ) from None
        _check_one(spec, want, value, accept_float_for_quantized)
        out[spec.name] = value
    return out


def is_tensor(dtype: str) -> bool:
    """False for onnxruntime's non-tensor inputs (``seq(...)``, ``optional(...)``, ``map(...)``)."""
    return "(" not in dtype


def numpy_dtype(name: str) -> np.dtype[Any] | None:
    """The numpy dtype of an edgeinfer dtype name; ``None`` where numpy and ml_dtypes lack it.

    ``"str"`` (``tensor(string)``) is ``object``, the array type onnx and onnxruntime use.
    """
    if name == "str":
        return np.dtype(object)
    try:
        return np.dtype(name)
    except TypeError:
        pass
    try:
        import ml_dtypes
    except ImportError:
        return None
    found = getattr(ml_dtypes, name, None)
    return np.dtype(found) if found is not None else None


def _check_one(spec: TensorSpec, want: np.dtype[Any] | None, value: np.ndarray,
               accept_float: bool) -> None:
    if spec.dtype == "str":
        if value.dtype.kind not in "OU":
            raise InvalidInputError(
                f"input {spec.name!r}: expected strings, got dtype {value.dtype.name} "
                "(give a numpy array of str: np.array([...], dtype=object) or dtype=np.str_)"
            )
    elif want is None:
        if value.dtype.name != spec.dtype:
            raise InvalidInputError(
                f"input {spec.name!r}: expected dtype {spec.dtype} (an ml_dtypes type), "
                f"got {value.dtype.name}"
            )
    elif value.dtype != want and not (
        accept_float and spec.quantization is not None and value.dtype.kind == "f"
    ):
        where = "np" if hasattr(np, want.name) else "ml_dtypes"  # bfloat16, float8, int4...
        raise InvalidInputError(
            f"input {spec.name!r}: expected dtype {want.name}, got {value.dtype.name}"
            f" (convert with .astype({where}.{want.name}))"
        )
    if len(spec.shape) != value.ndim:
        raise InvalidInputError(
            f"input {spec.name!r}: expected shape {format_shape(spec.shape)} "
            f"({len(spec.shape)} dims), got {tuple(value.shape)} ({value.ndim} dims)"
        )
    for want_dim, got in zip(spec.shape, value.shape):
        if isinstance(want_dim, int) and want_dim >= 0 and want_dim != got:
            raise InvalidInputError(
                f"input {spec.name!r}: expected shape {format_shape(spec.shape)}, "
                f"got {tuple(value.shape)}"
            )


def format_shape(shape: tuple[Dim, ...]) -> str:
    """``(1, 'batch', None)`` -> ``[1, batch, ?]``; a dimension onnxruntime gives as a formula
    (YOLOv8's output: 300 characters of ``floor(...)``) is ``?`` too."""
    return "[" + ", ".join("?" if d is None or (isinstance(d, str) and not d.isidentifier())
                           else str(d) for d in shape) + "]"


def warmup_feeds(
    specs: tuple[TensorSpec, ...],
    fixed: Mapping[str, tuple[int, ...]],
    values: Mapping[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], bool]:
    """Inputs for a warm-up run, and whether any dynamic dimension had to be guessed.

    A dynamic dimension is taken from ``fixed`` when given, else guessed as 1. An input named
    in ``values`` takes that value (a scalar is broadcast to the shape); the others are zeros
    (empty strings for string inputs).

    Raises:
        InvalidInputError: an input no value can be made up for (a sequence, or a type numpy
            lacks), or a given value that does not fit.
    """
    values = values or {}
    feeds: dict[str, np.ndarray] = {}
    guessed = False
    for spec in specs:
        want = numpy_dtype(spec.dtype) if is_tensor(spec.dtype) else None
        if want is None:
            raise InvalidInputError(
                f"input {spec.name!r} is {spec.dtype}: no warm-up value can be made up for it"
            )
        shape = fixed.get(spec.name)
        if shape is None:
            dims = []
            for d in spec.shape:
                if isinstance(d, int) and d >= 0:
                    dims.append(d)
                else:
                    dims.append(1)
                    guessed = True
            shape = tuple(dims)
        if spec.name in values:
            try:
                given = np.asarray(values[spec.name], dtype=want)
                feeds[spec.name] = given if given.shape == tuple(shape) else np.broadcast_to(
                    given, shape).copy()
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"warmup_inputs[{spec.name!r}] does not fit {spec.dtype} "
                    f"{format_shape(tuple(shape))}: {exc}"
                ) from None
        elif spec.dtype == "str":
            feeds[spec.name] = np.full(shape, "", dtype=object)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=want)
    return feeds, guessed


def warm_up(session: Session, spec: SessionSpec) -> None:
    """One inference before the session is handed out; the outcome goes into its report.

    A warm-up never refuses a model the runtime loaded: the values it feeds are made up (zeros,
    dynamic dimensions guessed as 1), and for many models zeros are no valid input (a Reshape
    shape, Resize scales, a divisor, a sample rate). A failed run is skipped with a warning and
    a note in ``report.warmup_note`` saying what to pass (``input_shapes``, ``warmup_inputs``).
    Only when the caller gave every input's value in ``warmup_inputs`` and every dynamic
    dimension in ``input_shapes`` is a failure a ``ModelLoadError`` (the session is closed).
    Running out of memory stays a ``ModelMemoryError``.
    """
    report = session.report
    try:
        feeds, guessed = warmup_feeds(session.inputs, spec.input_shapes, spec.warmup_inputs)
    except InvalidInputError as exc:
        _skip(report, spec, f"warm-up skipped: {exc}")
        return
    start = time.perf_counter()
    try:
        session.run(feeds)
    except ModelMemoryError:
        session.close()
        raise
    except InferenceError as exc:
        if not guessed and set(spec.warmup_inputs) >= set(feeds):
            session.close()
            raise ModelLoadError(
                f"{spec.path.name}: warm-up run with the given warmup_inputs failed: {exc}"
            ) from exc
        if guessed:
            why = _guessed_shapes_refused(session.inputs, feeds, exc)
        else:
            made_up = sorted(set(feeds) - set(spec.warmup_inputs))
            # bfloat16, float8, int4 (ml_dtypes): onnxruntime's Python API may take none of them
            foreign = sorted({v.dtype.name for v in feeds.values() if not hasattr(np, v.dtype.name)})
            if foreign:
                why = f"the runtime took no {', '.join(foreign)} arrays ({exc})"
            else:
                why = (f"the model refused zeros for {made_up} ({exc}); give warmup_inputs with "
                       "valid values to warm it up, e.g. {'sr': 16000}")
        _skip(report, spec, f"warm-up skipped: {why}")
        return
    report.warmup_ms = (time.perf_counter() - start) * 1000
    report.warmed_up = True


def _guessed_shapes_refused(specs: tuple[TensorSpec, ...], feeds: Mapping[str, np.ndarray],
                            exc: Exception) -> str:
    """What to pass, in the API's and the command line's words; the runtime's internals (its
    source file, C++ signatures) reduced to the node that refused."""
    dynamic = [s for s in specs if any(not (isinstance(d, int) and d >= 0) for d in s.shape)]
    tried = ", ".join(f"{s.name} {format_shape(feeds[s.name].shape)}" for s in dynamic)
    example = {s.name: ",".join(str(d) if isinstance(d, int) and d >= 0 else
                                (d if isinstance(d, str) and d.isidentifier() else "N")
                                for d in s.shape) for s in dynamic}
    node = re.search(r"running (\w+) node\. Name:'([^']*)'", str(exc))
    where = f" at its {node[1]} node {node[2]!r}" if node else f" ({str(exc)[:160]})"
    flags = " ".join(f"--input-shape {name}={dims}" for name, dims in example.items())
    api = ", ".join(f"{name!r}: [{dims.replace(',', ', ')}]" for name, dims in example.items())
    return (f"the model refused the guessed input shapes ({tried}){where}; give its real sizes: "
            f"{flags} (Python: input_shapes={{{api}}})")


def _skip(report: LoadReport, spec: SessionSpec, note: str) -> None:
    report.warmup_note = note
    logger.warning("%s: %s", spec.path.name, note)
