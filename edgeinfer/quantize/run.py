"""INT8 quantization of ONNX models with onnxruntime's tooling, and a model card with an
accuracy report against the float model.

Static quantization (QDQ) calibrates activation ranges on real inputs that go through the very
``Task.preprocess`` a pipeline uses, so the ranges are those the model will see. Recurrent
models (LSTM/GRU/RNN/Loop/Scan, e.g. Silero VAD) get dynamic quantization: weights in INT8,
activation ranges computed per run. The layout follows the CPU the model will run on:

- ``x86_64``: activations uint8, weights int8 (U8S8), 7-bit weights (``REDUCE_RANGE``).
  Measured here, S8S8 QDQ ran YOLOv8n-320 4-5x slower than U8S8: x86's VNNI/AVX2 integer
  kernels multiply u8 by s8.
- ``aarch64``: activations and weights int8 (S8S8), what onnxruntime recommends on ARM.

The output is written to a temporary file next to ``output`` and renamed into place only when
the quantized model has loaded, run and been measured, so a failure leaves no partial file.
Calibration/held-out inputs and the accuracy metrics live in ``edgeinfer._accuracy``. See
``docs/quantize.md``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..version import __version__
from ..pipeline.build import select, task_load_options
from ..model.catalog import resolve_model
from ..config import Config, load_config
from ..config.pipeline import RawTask
from ..config.schema import PipelineConfig
from ..errors import BackendUnavailableError, ConfigError, ModelError, ModelFormatError
from ..model.model import Model
from ..model.load import load_model
from ..runtime.modelfile import ModelFileInfo, inspect_model
from ..runtime.backends.ort_log import onnxruntime_quiet
from ..tasks import make_task
from ..tasks.base import Task
from ..tasks.vad import silero_load_options
from .accuracy import MIN_SAMPLES, Feeds, collect, measure
from .graph import (
    exclusions,
    first_conv,
    graph_op_types,
    head_nodes,
    name_nodes,
    op_types,
    output_nodes,
    prepare,
)

if TYPE_CHECKING:
    import onnx


__all__ = ["FLOAT_TYPES", "MIN_SAMPLES", "TARGETS", "ModelCard", "first_conv", "graph_op_types",
           "head_nodes", "is_recurrent", "output_nodes", "quantize_model"]

logger = logging.getLogger("edgeinfer.quantize")  # its name before the package; users filter on it

Progress = Callable[[int, int], None]

TARGETS: dict[str, tuple[str, str]] = {"x86_64": ("QUInt8", "QInt8"), "aarch64": ("QInt8", "QInt8")}
"""Per target CPU, onnxruntime ``QuantType`` names of (activations, weights)."""

REDUCE_RANGE: dict[str, bool] = {"x86_64": True, "aarch64": False}
"""Default of ``reduce_range`` per target. x86 CPUs without VNNI (AVX2 only: most x86 edge
boards, and the AMD EPYC these numbers were measured on) multiply u8 by s8 with ``vpmaddubsw``,
whose pairwise int16 sums saturate with full 8-bit weights; 7-bit weights cannot. Measured on
YOLOv8n-320 here: mAP@0.5 against float 0.63 with 8-bit weights, 0.84 with 7-bit, same speed."""

FLOAT_TYPES: dict[str, tuple[str, ...]] = {"x86_64": ("MaxPool",), "aarch64": ()}
"""Operator types static quantization keeps in float per target. On x86_64, onnxruntime's
uint8 MaxPool took 1.66 ms of YOLOv8n-320's 27 ms against 0.12 ms for the float one (profiled
here, 1 thread): keeping it float (a DequantizeLinear/QuantizeLinear pair around it) made the
INT8 model 5-7 % faster with the same detections."""

_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}
METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN", "Loop", "Scan"})

CARD_FORMAT = "edgeinfer-model-card/1"



@dataclass(frozen=True, slots=True)
class ModelCard:
    """What ``quantize_model`` wrote: the model, its card and the accuracy report.

    Attributes:
        path: The quantized model.
        card_path: The model card JSON next to it (``<output stem>.card.json``).
        data: The whole card (see ``docs/quantize.md`` for its fields).
    """

    path: Path
    card_path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> dict[str, Any]:
        """The accuracy report against the float model."""
        report: dict[str, Any] = self.data.get("report") or {}
        return report

    @property
    def warnings(self) -> list[str]:
        """Warnings raised while quantizing (few samples, skipped files, ...)."""
        return list(self.data.get("warnings") or [])

    def to_dict(self) -> dict[str, Any]:
        """The card as written to ``card_path``."""
        return dict(self.data)


def quantize_model(
    model: str | os.PathLike[str],
    output: str | os.PathLike[str],
    calibration: str | os.PathLike[str] | None = None,
    *,
    config: Any = None,
    pipeline: str | None = None,
    mode: str = "auto",
    target: str = "auto",
    method: str = "percentile",
    per_channel: bool = True,
    exclude_nodes: Iterable[str] = (),
    exclude_types: Iterable[str] = (),
    exclude_first_conv: bool = False,
    exclude_head: bool = False,
    samples: int = 100,
    held_out: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Progress | None = None,
    reduce_range: bool | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ModelCard:
    """Quantize a float ONNX model to INT8 and measure it against the original.

    Args:
        model: The float ONNX file (or an example model's name).
        output: Where the INT8 model goes; the card goes to ``<output>.card.json``.
        calibration: A folder of images, a video file, or an ``.npz`` of input tensors (keys:
            input names, first axis: samples). Required for static quantization.
        config: The pipeline whose task preprocesses the images and decides the report: a YAML
            path, a loaded ``Config``, a ``PipelineConfig``, or a task config struct (e.g.
            ``DetectTask(decoder="yolov8", ...)``). Default: the ``raw`` task.
        pipeline: The pipeline of ``config`` (default: its only one).
        mode: ``static``, ``dynamic``, or ``auto`` (dynamic for recurrent models).
        target: ``x86_64`` (U8S8), ``aarch64`` (S8S8) or ``auto`` (this machine).
        method: Calibration: ``percentile`` (the default: clips rare extreme activations, which
            kept YOLOv8n-320's mAP against float at 0.84 where ``minmax`` gave 0.57),
            ``minmax`` or ``entropy``.
        per_channel: One weight scale per output channel.
        exclude_nodes, exclude_types: Nodes (by name) and operator types kept in float (besides
            the target's `FLOAT_TYPES`).
        exclude_first_conv: Keep the first convolution in float.
        exclude_head: Keep the nodes after the last feature convolution in float.
        samples: Calibration samples to use at most.
        held_out: Inputs for the accuracy report; default: samples of ``calibration`` left out
            of calibration.
        force: Overwrite ``output``.
        progress: Called as ``progress(done, total)`` during calibration.
        reduce_range: Quantize weights to 7 bits (default: on for ``x86_64``, see
            ``REDUCE_RANGE``; off for ``aarch64``).
        input_shapes: Fixed shapes for the model's dynamic inputs (``{"images": [1, 3, 320,
            320]}``); over those the config's preprocessing or an ``.npz`` implies.

    Returns:
        The model card.

    Raises:
        ConfigError: bad options, ``output`` exists (without ``force``) or is the input, or
            calibration data that is missing, empty or unreadable.
        ModelError: the model cannot be quantized (TFLite, already quantized, float16, no
            quantizable operators) or its quantized version fails to load or run.
    """
    _require_tooling()
    with _onnxruntime_quiet():
        return _quantize(model, output, calibration, config=config, pipeline=pipeline, mode=mode,
                         target=target, method=method, per_channel=per_channel,
                         exclude_nodes=exclude_nodes, exclude_types=exclude_types,
                         exclude_first_conv=exclude_first_conv, exclude_head=exclude_head,
                         samples=samples, held_out=held_out, force=force, progress=progress,
                         reduce_range=reduce_range, input_shapes=input_shapes)


def _onnxruntime_quiet() -> contextlib.AbstractContextManager[None]:
    """onnxruntime's advice while it quantizes for us: at debug level under this logger."""
    return onnxruntime_quiet(logger)


def _quantize(model: str | os.PathLike[str], output: str | os.PathLike[str],
              calibration: str | os.PathLike[str] | None, *, config: Any, pipeline: str | None,
              mode: str, target: str, method: str, per_channel: bool,
              exclude_nodes: Iterable[str], exclude_types: Iterable[str],
              exclude_first_conv: bool, exclude_head: bool, samples: int,
              held_out: str | os.PathLike[str] | None, force: bool, progress: Progress | None,
              reduce_range: bool | None, input_shapes: Mapping[str, Sequence[int]] | None
              ) -> ModelCard:
    src = resolve_model(model)
    info = inspect_model(src)
    _check_quantizable(src, info)
    out = Path(output)
    _check_output(src, out, force)
    arch = _target(target)
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if samples < 1:
        raise ConfigError(f"samples must be at least 1, got {samples}")
    graph_ops = info.onnx.op_counts if info.onnx else {}
    chosen = _mode(mode, graph_ops, info)
    if chosen == "static" and calibration is None:
        raise ConfigError("static quantization needs calibration data (--calibration DIR, "
                          "VIDEO or NPZ)")
    task_cfg, source_cfg = _task_config(config, pipeline)
    warnings: list[str] = []
    npz_shapes = _npz_shapes(calibration) or _npz_shapes(held_out)
    load_opts = _load_options(task_cfg, source_cfg, src, info, npz_shapes)
    if input_shapes:
        load_opts["input_shapes"] = {**(load_opts.get("input_shapes") or {}),
                                     **{k: list(v) for k, v in input_shapes.items()}}
    with load_model(src, **load_opts) as float_model:
        task = _make_task(task_cfg, float_model, calibration, held_out)
        calib, held, data_card = collect(task, float_model, calibration, held_out, samples,
                                         chosen, warnings)
        with tempfile.TemporaryDirectory(prefix="edgeinfer-quantize-") as work:
            prepared, prep_note = prepare(src, Path(work))
            proto = name_nodes(prepared)
            excluded = exclusions(proto, src, exclude_nodes, exclude_first_conv, exclude_head,
                                   warnings)
            settings = _settings(chosen, arch, method, per_channel, excluded, exclude_types,
                                 exclude_first_conv, exclude_head, prep_note,
                                 REDUCE_RANGE[arch] if reduce_range is None else reduce_range)
            settings["float_outputs"] = [n for n in output_nodes(proto) if n not in excluded]
            return _write(src, info, out, float_model, task, task_cfg, calib, held, data_card,
                          settings, warnings, load_opts, progress, Path(work), proto)


# --- checks -----------------------------------------------------------------------------------

def _require_tooling() -> None:
    try:
        import onnx  # noqa: F401  (onnxruntime's quantizer reads and writes models with it)
        import onnxruntime.quantization  # noqa: F401
    except ImportError as exc:
        raise BackendUnavailableError(
            f"quantization needs onnxruntime and onnx ({exc.name} is missing): "
            "pip install 'edgeinfer[quantize]'") from exc


def _check_quantizable(src: Path, info: ModelFileInfo) -> None:
    if info.format != "onnx" or info.onnx is None:
        raise ModelFormatError(f"{src} is a {info.format} model; quantize the float ONNX model "
                               "(TFLite models are quantized when they are converted)")
    q = info.onnx.quantization
    if q == "float16":
        raise ModelFormatError(f"{src} is a float16 model; INT8 quantization needs the float32 "
                               "model it was made from")
    if q != "float":
        raise ModelFormatError(f"{src} is already quantized ({q}); quantize the float model")


def _check_output(src: Path, out: Path, force: bool) -> None:
    if out.exists() and out.resolve() == src.resolve():
        raise ConfigError(f"OUT {out} is the input model; give another output path")
    if out.is_dir():
        raise ConfigError(f"OUT {out} is a directory; give a file path")
    if out.exists() and not force:
        raise ConfigError(f"OUT {out} exists; use --force to overwrite it")
    if not out.parent.is_dir():
        raise ConfigError(f"OUT {out}: folder {out.parent} does not exist")


def _target(target: str) -> str:
    if target == "auto":
        machine = platform.machine().lower()
        arch = _MACHINES.get(machine)
        if arch is None:
            raise ConfigError(f"target auto: no INT8 layout known for this machine ({machine}); "
                              f"give target {' or '.join(TARGETS)}")
        return arch
    if target not in TARGETS:
        raise ConfigError(f"target must be auto, {', '.join(TARGETS)}; got {target!r}")
    return target


def is_recurrent(op_counts: Iterable[str], input_names: Iterable[str] = ()) -> bool:
    """Whether a graph (its op types, subgraphs included) carries state between runs: a
    recurrent op, or an ``If`` in a model fed a ``state`` input (how Silero VAD is built)."""
    ops = set(op_counts)
    if ops & RECURRENT_OPS:
        return True
    return "If" in ops and any("state" in n.lower() for n in input_names)


def _mode(mode: str, ops: Any, info: ModelFileInfo) -> str:
    if mode not in ("auto", "static", "dynamic"):
        raise ConfigError(f"mode must be auto, static or dynamic; got {mode!r}")
    if mode != "auto":
        return mode
    inputs = info.onnx.inputs if info.onnx else {}
    return "dynamic" if is_recurrent(ops, inputs) else "static"


# --- task and loading ---------------------------------------------------------------------------

def _task_config(config: Any, pipeline: str | None) -> tuple[Any, Any]:
    """(task config, source config) from whatever ``config`` is."""
    if config is None:
        if pipeline is not None:
            raise ConfigError("--pipeline needs --config")
        return RawTask(), None
    if isinstance(config, (str, os.PathLike)):
        config = load_config(config)
    if isinstance(config, Config):
        config = select(config, pipeline)
    if isinstance(config, PipelineConfig):
        return config.task, config.source
    if hasattr(type(config), "__struct_config__"):
        return config, None
    raise ConfigError(f"config must be a YAML path, a Config, a PipelineConfig or a task "
                      f"config; got {type(config).__name__}")


def _task_tag(task_cfg: Any) -> str:
    return str(type(task_cfg).__struct_config__.tag)


def _load_options(task_cfg: Any, source_cfg: Any, src: Path, info: ModelFileInfo,
                  npz_shapes: dict[str, list[int]] | None) -> dict[str, Any]:
    opts: dict[str, Any] = dict(task_load_options(
        SimpleNamespace(task=task_cfg, source=source_cfg), src))  # type: ignore[arg-type]
    inputs = info.onnx.inputs if info.onnx else {}
    if not opts and {"input", "state", "sr"} <= set(inputs):
        opts = silero_load_options()  # Silero VAD without a config: zeros are no valid `sr`
    if npz_shapes:
        shapes = dict(opts.get("input_shapes") or {})
        for name, shape in npz_shapes.items():
            dims = inputs.get(name)
            if dims is not None and not all(isinstance(d, int) for d in dims):
                # one sample: the array less its first axis, with a batch of 1 when it has the
                # input's rank (as read_samples cuts it)
                one = shape[1:] if len(shape) == len(dims) + 1 else [1, *shape[1:]]
                shapes.setdefault(name, one)
        if shapes:
            opts["input_shapes"] = shapes
    return opts


def _npz_shapes(source: Any) -> dict[str, list[int]] | None:
    """The shape of one sample per key of an ``.npz`` (to fix a model's dynamic dims)."""
    if source is None or Path(source).suffix.lower() != ".npz" or not Path(source).is_file():
        return None
    try:
        with np.load(source, allow_pickle=False) as z:
            return {k: list(z[k].shape) for k in z.files}
    except Exception:  # read_samples reports it with its own message
        return None


def _make_task(task_cfg: Any, model: Model, calibration: Any, held_out: Any) -> Task:
    try:
        return make_task(task_cfg, model)
    except ConfigError as exc:
        npz_only = all(s is None or Path(s).suffix.lower() == ".npz"
                       for s in (calibration, held_out))
        if _task_tag(task_cfg) == "raw" and npz_only:
            return _FeedsOnly(task_cfg, model)  # tensors need no preprocessing
        hint = "" if _task_tag(task_cfg) != "raw" else (
            " (give --config with a pipeline whose task sets preprocess.size, or an .npz)")
        raise ConfigError(f"{exc}{hint}") from exc


class _FeedsOnly(Task):
    """The task for ready tensors (``.npz``) when the model's inputs are no image."""

    def preprocess(self, frame: Any) -> tuple[dict[str, np.ndarray], Any]:
        raise ConfigError("this model takes ready tensors: give calibration data as .npz")

    def postprocess(self, outputs: Any, frame: Any, context: Any) -> Any:
        raise NotImplementedError


def _settings(mode: str, arch: str, method: str, per_channel: bool, excluded: list[str],
              exclude_types: Iterable[str], first: bool, head: bool, prep: str,
              reduce_range: bool) -> dict[str, Any]:
    act, weight = TARGETS[arch] if mode == "static" else ("QUInt8", "QInt8")
    return {
        "mode": mode, "target": arch, "format": "QDQ" if mode == "static" else "QOperator",
        "activation_type": act, "weight_type": weight, "per_channel": per_channel,
        "method": method if mode == "static" else None,
        "exclude_nodes": excluded, "exclude_types": sorted({t for t in exclude_types if t}),
        "exclude_first_conv": first, "exclude_head": head,
        "float_outputs": [], "preprocessing": prep, "reduce_range": reduce_range,
        "float_types": list(FLOAT_TYPES[arch]) if mode == "static" else [],
    }


# --- quantize, measure, write ----------------------------------------------------------------

def _write(src: Path, info: ModelFileInfo, out: Path, float_model: Model, task: Task,
           task_cfg: Any, calib: list[Feeds], held: list[Feeds], data_card: dict[str, Any],
           settings: dict[str, Any], warnings: list[str], load_opts: dict[str, Any],
           progress: Progress | None, work: Path, proto: onnx.ModelProto) -> ModelCard:
    import onnx

    card_path = out.with_suffix(".card.json")
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=".partial.onnx")
    # mkstemp makes it 0600: a model is no secret, and the service (systemd DynamicUser=) must
    # read it. The mode a new file gets here (0644 under the usual umask 022).
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp = Path(tmp_name)
    card_tmp = card_path.with_name(f".{card_path.name}.partial")
    try:
        named = work / "named.onnx"
        onnx.save(proto, str(named))
        t0 = time.monotonic()
        if settings["mode"] == "static":
            names = [s.name for s in float_model.inputs]
            _quantize_static(named, tmp, proto, calib, names, settings, progress)
        else:
            _quantize_dynamic(named, tmp, proto, settings)
        elapsed = time.monotonic() - t0
        card = _card(src, info, tmp, out, float_model, task, task_cfg, held, data_card,
                          settings, warnings, load_opts, elapsed)
        card_tmp.write_text(_dumps(card), encoding="utf-8")
        os.replace(tmp, out)
        os.replace(card_tmp, card_path)
    except BaseException:
        for p in (tmp, card_tmp):
            p.unlink(missing_ok=True)
        raise
    logger.info("quantized %s -> %s (%s)", src, out, card["output"]["quantization"])
    return ModelCard(out, card_path, card)


def _dumps(card: dict[str, Any]) -> str:
    import json

    return json.dumps(card, indent=2, default=str) + "\n"


class _Reader:
    """Hands onnxruntime's calibrator one feed dict at a time, reporting progress."""

    def __init__(self, feeds: Sequence[Feeds], names: Sequence[str], progress: Progress | None
                 ) -> None:
        self._feeds, self._names, self._progress = feeds, names, progress
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self._feeds):
            return None
        feeds = self._feeds[self._next]
        self._next += 1
        if self._progress is not None:
            self._progress(self._next, len(self._feeds))
        return {k: feeds[k] for k in self._names if k in feeds}

    def rewind(self) -> None:
        self._next = 0


def _quantize_static(named: Path, tmp: Path, proto: onnx.ModelProto, calib: Sequence[Feeds],
                     names: Sequence[str], settings: dict[str, Any], progress: Progress | None
                     ) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static, registry)

    allowed = set(registry.QDQRegistry) | set(registry.QLinearOpsRegistry)
    ops = op_types(proto, allowed, [*settings["exclude_types"], *settings["float_types"]],
                    named.name, "static")
    # onnxruntime is imported here, not at the top, so its reader base class is mixed in here.
    reader = type("CalibrationReader", (_Reader, CalibrationDataReader), {})(calib, names,
                                                                              progress)
    chatter = io.StringIO()  # the percentile/entropy calibrators print() their progress
    try:
        with contextlib.redirect_stdout(chatter):
            quantize_static(
                str(named), str(tmp), reader, quant_format=QuantFormat.QDQ,
                op_types_to_quantize=ops, per_channel=settings["per_channel"],
                reduce_range=settings["reduce_range"],
                activation_type=getattr(QuantType, settings["activation_type"]),
                weight_type=getattr(QuantType, settings["weight_type"]),
                nodes_to_exclude=settings["exclude_nodes"] + settings["float_outputs"],
                calibrate_method=getattr(CalibrationMethod, METHODS[settings["method"]]),
            )
    except (ModelError, ConfigError):
        raise
    except Exception as exc:  # onnxruntime's tooling raises whatever it meets
        raise ModelError(f"static quantization failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if chatter.getvalue():
            logger.debug("onnxruntime calibration: %s", chatter.getvalue().strip())


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` sets it, racing threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


# ConvInteger, what dynamic quantization makes of a Conv, has CPU kernels for uint8 weights only:
# with int8 weights the model would not load. Convolutions stay float in dynamic mode.
_DYNAMIC_SKIP = frozenset({"Conv"})


def _quantize_dynamic(named: Path, tmp: Path, proto: onnx.ModelProto,
                      settings: dict[str, Any]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic, registry

    allowed = set(registry.IntegerOpsRegistry) - _DYNAMIC_SKIP
    ops = op_types(proto, allowed, settings["exclude_types"], named.name, "dynamic",
                    subgraphs=True)
    try:
        quantize_dynamic(str(named), str(tmp), op_types_to_quantize=ops,
                         per_channel=settings["per_channel"],
                         reduce_range=settings["reduce_range"],
                         weight_type=getattr(QuantType, settings["weight_type"]),
                         nodes_to_exclude=settings["exclude_nodes"] + settings["float_outputs"],
                         extra_options={"EnableSubgraph": True})
    except (ModelError, ConfigError):
        raise
    except Exception as exc:
        raise ModelError(f"dynamic quantization failed: {type(exc).__name__}: {exc}") from exc


def _card(src: Path, info: ModelFileInfo, tmp: Path, out: Path, float_model: Model, task: Task,
          task_cfg: Any, held: list[Feeds], data_card: dict[str, Any], settings: dict[str, Any],
          warnings: list[str], load_opts: dict[str, Any], elapsed: float) -> dict[str, Any]:
    """Check, load, run and measure the quantized model, and describe it all."""
    import msgspec
    import onnx
    import onnxruntime

    q_info = inspect_model(tmp)
    quantization = q_info.onnx.quantization if q_info.onnx else "unknown"
    if quantization == "float":
        raise ModelError(f"nothing in {src.name} was quantized (every quantizable node is "
                         "excluded?)")
    report = measure(tmp, float_model, task, held, load_opts)
    return {
        "format": CARD_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "input": {"path": str(src), "sha256": info.sha256, "size_bytes": info.size_bytes,
                  "quantization": "float"},
        "output": {"path": str(out), "sha256": q_info.sha256, "size_bytes": q_info.size_bytes,
                   "quantization": quantization},
        "size_ratio": round(q_info.size_bytes / max(info.size_bytes, 1), 4),
        "settings": settings,
        "task": {"type": _task_tag(task_cfg), "config": msgspec.to_builtins(task_cfg)},
        **data_card,
        "runtime": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
                    "edgeinfer": __version__, "machine": platform.machine(),
                    "quantize_s": round(elapsed, 2)},
        "report": report,
        "warnings": warnings,
    }


