"""``load_model``: from a file (or an example model's name) to a ``Model``.

Two ideas, one after the other: the caller's options are checked and turned into a
``SessionSpec`` (``session_spec``: nothing is opened), then the session is opened and admitted
(``open_model``): inspect the file (format from its bytes, sha256, size, safety) -> admit it
against the memory budget by its size -> build the session in-process or in a worker process
(provider chosen and verified, one warm-up run) -> measure what it really costs in resident
memory -> refuse it if that breaks ``memory_limit_mb`` or the process budget (nothing already
loaded is disturbed) -> hand out a ``Model``.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import paths, runtime
from ..errors import ConfigError, EdgeInferError, ModelMemoryError
from ..runtime.backends import backend_options
from ..runtime.backends.onnx import ARENAS, DEFAULT_ARENA
from ..runtime.base import PRECISIONS, DelegateSpec, LoadReport, Session, SessionSpec, TensorSpec
from ..runtime.busy import RecheckSettings
from ..runtime.memory import default_threads, process_budget, trim_heap
from ..runtime.modelfile import ModelFileInfo, inspect_model
from ..runtime.providers import normalize
from ..runtime.gate import OutputsGate
from .catalog import CATALOG, CatalogModel, for_path, resolve_model
from .model import Model
from .samples import photo_feeds

if TYPE_CHECKING:
    from ..runtime.select import Gate

logger = logging.getLogger("edgeinfer.model")  # the name before the move

DEFAULT_MAX_MODEL_MB = 512.0
ISOLATIONS = ("none", "process")
__all__ = ["ARENAS", "DEFAULT_ARENA", "DEFAULT_MAX_MODEL_MB", "ISOLATIONS", "check_options",
           "example_defaults", "load_model", "open_model"]  # ARENAS, DEFAULT_ARENA: onnx's own

_load_lock = threading.Lock()  # loads are serialized so resident-memory deltas are this model's
_ids = itertools.count(1)


def load_model(
    path: str | os.PathLike[str],
    *,
    providers: str | Iterable[str] = "auto",
    threads: int | None = None,
    memory_limit_mb: float | None = None,
    isolation: str = "none",
    strict_providers: bool = False,
    probe: bool | str = True,
    precision: str = "fp16",
    probe_budget_s: float = 15.0,
    recheck: RecheckSettings | Mapping[str, Any] | bool | None = None,
    gate: Gate | str | None = None,
    input_shapes: Mapping[str, Iterable[int]] | None = None,
    arena: str = DEFAULT_ARENA,
    delegates: Iterable[DelegateSpec | Mapping[str, Any] | str] = (),
    warmup: bool = True,
    warmup_inputs: Mapping[str, Any] | None = None,
    max_model_mb: float | None = None,
    name: str | None = None,
    version: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    optimized_model_cache: bool = True,
    worker_timeout_s: float | None = None,
    worker_nice: int = 0,
) -> Model:
    """Load an ONNX or TFLite model (format detected from its bytes) on the best provider.

    Args:
        path: the model file, or an example model's name or file name (``"nudenet-320n"``,
            ``"320n.onnx"``) found in the models cache, pulled into it when missing, as the
            CLI and configs do (``edgeinfer.model.catalog.resolve_model``).
        providers: ``"auto"``: every backend installed here (onnxruntime and its providers,
            OpenVINO, LiteRT, ARM NN) is a candidate; or names/aliases that narrow the choice
            (``"cpu"``, ``"cuda"``, ``"openvino"``, ``"litert"``, ``"armnn"``...).
        threads: intra-op threads; default the physical cores, at most 4.
        memory_limit_mb: refuse the model if load + first run cost more resident memory; with
            ``isolation="process"`` also the worker's address-space limit.
        isolation: ``"none"`` or ``"process"`` (a worker subprocess; a crash raises
            ``WorkerCrashed`` and ``Model.restart()`` revives it).
        strict_providers: a fallback from the first provider asked for is an error.
        probe: ``True`` (default): on the first load, measure every candidate (backend x
            precision x threads up to ``threads``), refuse those whose outputs differ from the
            fp32 reference, keep the fastest; the decision is cached in ``state_dir``, so later
            loads open the winner at once. ``"background"``: serve at once on the default
            configuration and swap to the winner between runs when measuring ends. ``False``:
            no measuring, onnxruntime (or LiteRT) with its ranked providers.
        precision: the lowest arithmetic a candidate may use: ``"fp32"``, ``"fp16"`` (also
            bf16; default) or ``"int8"``. Every candidate still passes the accuracy gate.
        probe_budget_s: how long measuring may take.
        recheck: when a decision measured while other processes kept the CPUs busy (it is
            then marked ``measured_under_load``, provisional) is measured again, and when live
            latency drifting from the measured one triggers that too:
            ``runtime.busy.RecheckSettings``, a mapping of its fields, ``True``/``None`` (the
            defaults: re-check after 30 s idle, never in the first 60 s) or ``False`` (off).
        gate: how candidates are checked against the reference (``runtime.select.Gate``);
            default: every output close (cosine >= 0.9999, error <= 1e-3 of its range).
            Pipelines pass their task's gate (detections, top-1 class). With
            ``probe="background"`` a gate's key alone (``"detect"``) opens a decision cached
            under it; measuring then waits for ``Model.select_backend(gate)``.
        input_shapes: fixed shapes for inputs with dynamic dimensions.
        arena: ``"bounded"``, ``"off"`` or ``"default"`` (ONNX only).
        delegates: TFLite external delegates: library paths or ``{library, options}``.
        warmup: run one inference before returning. It never refuses a model the runtime
            loaded: if the model refuses the made-up feeds (zeros, guessed dynamic dimensions)
            the warm-up is skipped with a warning and ``report.warmup_note``.
        warmup_inputs: values for the warm-up by input name (scalars broadcast), for models
            where zeros are not valid input (e.g. ``{"sr": 16000}``); other inputs get zeros.
            With every input given (and no dimension guessed) a failed warm-up is a
            ``ModelLoadError``.
        max_model_mb: refuse larger files (default 512).
        name, version: identity reported in results (default name: the file's stem).
        state_dir, cache_dir: override the state and cache directories.
        optimized_model_cache: keep the optimized ONNX graph for faster later loads.
        worker_timeout_s: with ``isolation="process"``, a load or a run longer than this kills
            the worker (default: 60 s to load, runs unlimited).
        worker_nice: with ``isolation="process"``, run the worker this much nicer.

    Raises:
        ModelNotFoundError, ModelFormatError, UnsafeModelError, ModelTooLargeError,
        ModelLoadError, ModelMemoryError, ProviderError, ConfigError (bad arguments).
    """
    check_options(isolation=isolation, threads=threads, memory_limit_mb=memory_limit_mb,
                  probe=probe, precision=precision, probe_budget_s=probe_budget_s, gate=gate)
    options = backend_options(arena=arena, delegates=delegates)  # each backend checks its own
    recheck_settings = RecheckSettings.of(recheck)
    limit = DEFAULT_MAX_MODEL_MB if max_model_mb is None else max_model_mb
    info = inspect_model(resolve_model(path), max_model_mb=limit)
    shapes_from = "input_shapes" if input_shapes else ""
    if input_shapes is None and warmup_inputs is None:
        input_shapes, warmup_inputs = example_defaults(path, info)
        shapes_from = "the example model's own" if input_shapes else ""
    if not input_shapes:
        input_shapes = metadata_shapes(info)
        shapes_from = "the model's metadata (imgsz)" if input_shapes else ""
    model_name = name or info.path.stem
    process_budget().check(model_name, info.size_mb)  # early refusal: the weights alone must fit
    spec = SessionSpec(
        path=info.path.resolve(),
        format=info.format,
        sha256=info.sha256,
        threads=threads or default_threads(),
        providers=normalize(providers if isinstance(providers, str) else list(providers)),
        strict_providers=strict_providers,
        probe=bool(probe),
        precision=precision,
        probe_budget_s=float(probe_budget_s),
        recheck=recheck_settings,
        input_shapes={k: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()},
        input_shapes_from=shapes_from,
        memory_limit_mb=memory_limit_mb,
        cache_dir=(Path(cache_dir) if cache_dir else paths.cache_dir())
        if optimized_model_cache else None,
        state_dir=Path(state_dir) if state_dir else paths.state_dir(),
        options=options,
        warmup=warmup,
        warmup_inputs=dict(warmup_inputs or {}),
        graph_inputs=dict(info.onnx.inputs) if info.onnx is not None else {},
        external_data=bool(info.onnx is not None and info.onnx.external_data),
    )
    if gate is None and probe is True:
        gate = sample_gate(spec, info)
    return open_model(spec, info, model_name, version, isolation=isolation,
                      memory_limit_mb=memory_limit_mb, timeout_s=worker_timeout_s,
                      nice=worker_nice, gate=gate,
                      background=probe == "background" and isolation == "none")


# -- options ------------------------------------------------------------------------------------


def check_options(*, isolation: str, threads: int | None,
                  memory_limit_mb: float | None, probe: bool | str, precision: str,
                  probe_budget_s: float, gate: Gate | str | None) -> None:
    """Refuse arguments ``load_model`` cannot honour, before anything is read or opened (the
    backends check their own: ``runtime.backends.backend_options``).

    Raises:
        ConfigError: names the argument, its allowed values and what was given.
    """
    if isolation not in ISOLATIONS:
        raise ConfigError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    if memory_limit_mb is not None and memory_limit_mb <= 0:
        raise ConfigError(f"memory_limit_mb must be > 0, got {memory_limit_mb!r}")
    if probe not in (True, False, "background"):
        raise ConfigError(f"probe must be true, false or 'background', got {probe!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not probe_budget_s > 0:
        raise ConfigError(f"probe_budget_s must be > 0, got {probe_budget_s!r}")
    if isinstance(gate, str) and probe != "background":
        raise ConfigError("a gate given by its key needs probe='background'")


def example_defaults(path: str | os.PathLike[str], info: ModelFileInfo
                     ) -> tuple[dict[str, list[int]] | None, dict[str, Any] | None]:
    """An example model's own input shapes and warm-up values (as the CLI and configs use
    them): its dynamic input is fixed to the size it was exported for, so it warms up and its
    backends can be measured. ``(None, None)`` for any other file."""
    entry = _example(path, info)
    if entry is None:
        return None, None
    return ({n: list(d) for n, d in entry.input_shapes} or None,
            dict(entry.warmup_inputs) or None)


def _example(path: str | os.PathLike[str], info: ModelFileInfo) -> CatalogModel | None:
    """The example model ``path`` is: by its name or cached file, else by its bytes (a copy
    of an example model elsewhere is that model too)."""
    entry = for_path(path) or for_path(info.path)
    if entry is not None and entry.sha256 == info.sha256:
        return entry
    return next((e for e in CATALOG.values() if e.sha256 == info.sha256), None)


def metadata_shapes(info: ModelFileInfo) -> dict[str, list[int]] | None:
    """The size an image model was exported for, from its ONNX metadata (Ultralytics'
    ``imgsz``, ``[height, width]`` or one side), for its one image input whose height and
    width are dynamic (channels first or last; a dynamic batch is 1). None: no such input or
    no size in the metadata."""
    if info.onnx is None or len(info.onnx.inputs) != 1:
        return None
    sides = [int(n) for n in re.findall(r"\d+", info.onnx.metadata.get("imgsz", ""))]
    if len(sides) not in (1, 2) or not all(sides):
        return None
    height, width = (sides[0], sides[-1])
    ((name, dims),) = info.onnx.inputs.items()
    if len(dims) != 4:
        return None
    fixed = [d if isinstance(d, int) and d > 0 else None for d in dims]
    if fixed[1] in (1, 3) and (fixed[2] is None or fixed[3] is None):
        return {name: [fixed[0] or 1, fixed[1], height, width]}
    if fixed[3] in (1, 3) and (fixed[1] is None or fixed[2] is None):
        return {name: [fixed[0] or 1, height, width, fixed[3]]}
    return None


def sample_gate(spec: SessionSpec, info: ModelFileInfo) -> OutputsGate:
    """The outputs gate judging on the sample photographs as an image model sees them
    (``samples.photo_feeds``): normalized as an example model's own preprocessing, else
    scaled to 0-1 (the common export's, a guess the note says). A model that takes no image
    gets the selector's made-up inputs, as before."""
    entry = _example(spec.path, info)
    mean, std = entry.pixels if entry is not None else ((0.0,) * 3, (1.0,) * 3)
    shapes = dict(spec.input_shapes)
    how = "" if entry is not None else ", scaled 0-1: a guess, pass a task's gate to be sure"
    if any(m != 0 for m in mean) or any(d != 1 for d in std):
        how = f", (x/255 - {_triple(mean)}) / {_triple(std)}"

    def feeder(inputs: Sequence[TensorSpec]) -> list[dict[str, np.ndarray]]:
        return photo_feeds(inputs, shapes, mean=mean, std=std)

    return OutputsGate(feeder=feeder, samples=f"sample photos with a word (RGB{how})")


def _triple(values: Sequence[float]) -> str:
    return f"{values[0]:g}" if len(set(values)) == 1 else \
        "(" + ", ".join(f"{v:g}" for v in values) + ")"


# -- loading ------------------------------------------------------------------------------------


def open_model(spec: SessionSpec, info: ModelFileInfo, name: str, version: str | None, *,
               isolation: str = "none", memory_limit_mb: float | None = None,
               timeout_s: float | None = None, nice: int = 0, gate: Gate | str | None = None,
               background: bool = False) -> Model:
    """Open ``spec``'s session, admit its measured cost against the memory budget and hand
    out the ``Model``; a model over budget is closed again and ``ModelMemoryError`` raised."""
    budget = process_budget()
    with _load_lock:
        session = _open(spec, isolation, memory_limit_mb, timeout_s, nice, gate, background)
        try:
            cost = _admit(session.report, name, memory_limit_mb)
            key = next(_ids)
            budget.charge(key, name, cost)
        except ModelMemoryError:
            session.close()
            trim_heap()
            raise
    report = session.report
    logger.info(
        "loaded %s (%s, %s) on %s in %.0f ms, %.1f MiB%s", name, info.format,
        info.onnx.quantization if info.onnx else "tflite", report.provider, report.load_ms, cost,
        "" if report.warmed_up else " (not warmed up)",
    )
    model = Model(session, info, spec, name, version, key,
                  gate=None if isinstance(gate, str) else gate)
    if background and gate is not None and not isinstance(gate, str) \
            and session.report.selection is None:
        model.select_backend(gate, background=True)
    return model


def _open(spec: SessionSpec, isolation: str, memory_limit_mb: float | None,
          timeout_s: float | None, nice: int, gate: Gate | str | None = None,
          background: bool = False) -> Session:
    if background and runtime.measures(spec):
        # A cached decision opens the winner now; otherwise the default serves until
        # ``Model.select_backend`` has measured.
        from ..runtime import select

        key = gate if isinstance(gate, str) else (gate or select.OutputsGate()).key
        cached = select.load_cached(spec, key)
        if cached is not None:
            try:
                session = select.open_choice(spec, cached.choice, warmup=spec.warmup)
            except EdgeInferError as exc:
                logger.warning("the cached choice %s for %s no longer opens (%s); measuring "
                               "again", cached.choice.label(), spec.path.name, exc)
            else:
                select.annotate_decision(session, cached)
                return session
        return runtime.open_session(spec.replace(probe=False))
    if isolation == "process":
        from ..runtime.worker import WorkerSession

        if timeout_s is None:
            return WorkerSession(spec, memory_limit_mb, nice=nice)
        return WorkerSession(spec, memory_limit_mb, start_timeout_s=timeout_s,
                             run_timeout_s=timeout_s, nice=nice)
    return runtime.open_session(spec, None if isinstance(gate, str) else gate)


def _admit(report: LoadReport, name: str, memory_limit_mb: float | None) -> float:
    """The measured cost of load + first run; raises if it breaks the model's own limit."""
    cost = max(report.rss_first_run_mb, report.rss_load_mb, 0.0)
    if memory_limit_mb is not None and cost > memory_limit_mb:
        raise ModelMemoryError(
            f"model {name!r} costs {cost:.1f} MiB of resident memory after load and first run "
            f"(load {report.rss_load_mb:.1f} MiB), over its memory_limit_mb={memory_limit_mb:g}"
        )
    return cost
