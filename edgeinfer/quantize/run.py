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

This module checks the options and decides the settings; ``write`` quantizes with them and
writes the model and its card (nothing partial is left on failure). Calibration/held-out inputs
and the accuracy metrics live in ``accuracy``, reading the graph in ``graph``. See
``docs/quantize.md``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..pipeline.build import select, task_load_options
from ..model.catalog import resolve_model
from ..config import Config, load_config
from ..config.pipeline import RawTask
from ..config.schema import PipelineConfig
from ..errors import BackendUnavailableError, ConfigError, ModelFormatError
from ..model.model import Model
from ..model.load import load_model
from ..runtime.modelfile import ModelFileInfo, inspect_model
from ..runtime.backends.ort_log import onnxruntime_quiet
from ..tasks import make_task
from ..tasks.base import Task
from ..tasks.vad import silero_load_options
from .accuracy import MIN_SAMPLES, Stages, collect, no_stages
from .graph import (
    decode_head,
    exclusions,
    first_conv,
    graph_op_types,
    head_nodes,
    name_nodes,
    output_nodes,
    prepare,
    upgrade_opset,
)
from .write import METHODS, ModelCard, Progress, task_tag, write_quantized

__all__ = ["FLOAT_TYPES", "MIN_SAMPLES", "TARGETS", "ModelCard", "decode_head", "first_conv",
           "graph_op_types", "head_nodes", "is_recurrent", "output_nodes", "quantize_model"]

logger = logging.getLogger("edgeinfer.quantize")  # its name before the package; users filter on it

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
RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN", "Loop", "Scan"})


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
    quantize_head: bool = False,
    samples: int = 100,
    held_out: str | os.PathLike[str] | None = None,
    force: bool = False,
    progress: Progress | None = None,
    reduce_range: bool | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    stages: Stages | None = None,
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
        quantize_head: Quantize the decode head too (a head with a Concat, Sigmoid or Softmax
            after the last feature convolution, which stays float by default: see
            ``graph.decode_head``).
        samples: Calibration samples to use at most.
        held_out: Inputs for the accuracy report; default: samples of ``calibration`` left out
            of calibration.
        force: Overwrite ``output``.
        progress: Called as ``progress(done, total)`` during calibration.
        stages: Called as ``stages(stage, done, total)`` at the start of each stage (``done``
            0; ``total`` 0 where the stage is not counted: ``loading``, ``reading calibration
            data``, ``calibrating``, ``computing activation ranges, writing the INT8 graph``,
            ``loading the INT8 model``, ``evaluating``) and after each counted step.
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
                         quantize_head=quantize_head, samples=samples, held_out=held_out,
                         force=force, progress=progress, reduce_range=reduce_range,
                         input_shapes=input_shapes, stages=stages or no_stages)


def _onnxruntime_quiet() -> contextlib.AbstractContextManager[None]:
    """onnxruntime's advice while it quantizes for us: at debug level under this logger."""
    return onnxruntime_quiet(logger)


def _quantize(model: str | os.PathLike[str], output: str | os.PathLike[str],
              calibration: str | os.PathLike[str] | None, *, config: Any, pipeline: str | None,
              mode: str, target: str, method: str, per_channel: bool,
              exclude_nodes: Iterable[str], exclude_types: Iterable[str],
              exclude_first_conv: bool, exclude_head: bool, quantize_head: bool, samples: int,
              held_out: str | os.PathLike[str] | None, force: bool, progress: Progress | None,
              reduce_range: bool | None, input_shapes: Mapping[str, Sequence[int]] | None,
              stages: Stages) -> ModelCard:
    stages("loading", 0, 0)
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
    with load_model(src, **load_opts) as float_model, \
            tempfile.TemporaryDirectory(prefix="edgeinfer-quantize-") as work:
        task = _make_task(task_cfg, float_model, calibration, held_out)
        calib, held, data_card = collect(task, float_model, calibration, held_out, samples,
                                         chosen, warnings, Path(work) / "samples", stages)
        stages("preparing the graph", 0, 0)
        upgraded, opset_note = upgrade_opset(src, Path(work), per_channel)
        prepared, prep_note = prepare(upgraded, Path(work))
        proto = name_nodes(prepared)
        excluded = exclusions(proto, src, exclude_nodes, exclude_first_conv, exclude_head,
                               warnings)
        settings = _settings(chosen, arch, method, per_channel, excluded, exclude_types,
                             exclude_first_conv, exclude_head, prep_note,
                             REDUCE_RANGE[arch] if reduce_range is None else reduce_range)
        outputs = [n for n in output_nodes(proto) if n not in excluded]
        settings["float_outputs"] = outputs
        settings["quantize_head"] = quantize_head
        settings["float_head"] = [] if quantize_head else [
            n for n in decode_head(proto) if n not in excluded and n not in outputs]
        settings["opset_upgrade"] = opset_note
        return write_quantized(src, info, out, float_model, task, task_cfg, calib, held,
                               data_card, settings, warnings, load_opts, progress,
                               Path(work), proto, stages)


# --- checks -----------------------------------------------------------------------------------

def _require_tooling() -> None:
    try:
        import onnx  # noqa: F401  (onnxruntime's quantizer reads and writes models with it)
        import onnxruntime.quantization  # noqa: F401
    except ImportError as exc:
        if exc.name is None:  # the package is there, and its own import failed: say why
            raise BackendUnavailableError(
                f"onnxruntime's quantizer does not import here: {exc}; "
                "pip install -U 'edgeinfer[quantize]'") from exc
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
        if task_tag(task_cfg) == "raw" and npz_only:
            return _FeedsOnly(task_cfg, model)  # tensors need no preprocessing
        hint = "" if task_tag(task_cfg) != "raw" else (
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


