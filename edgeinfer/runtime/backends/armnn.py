"""ARM NN backend: Debian's ``pyarmnn`` running TFLite models on the Arm Compute Library.

ARM NN has no pip wheel; on an arm64 Debian 13 (trixie) board, or a Raspberry Pi OS built on
it, it comes from the distribution (see ``INSTALL``) and a venv sees it through
``--system-site-packages`` or a link to ``/usr/lib/python3/dist-packages/pyarmnn``.

- One exact ``Choice``: the device is an ARM NN backend (``CpuAcc``: Neon kernels of the Arm
  Compute Library; ``CpuRef`` where the build has it, Debian's does not), ``fp16`` turns on
  ARM NN's fp32-to-fp16 reduction (offered where the CPU does FP16 vector arithmetic,
  ``asimdhp``: a Cortex-A76 or A55, not a Pi 4's A72), ``threads`` is CpuAcc's
  ``NumberOfThreads``. No other backend is added behind the one asked for: a layer the device
  cannot run fails the load instead of running elsewhere unseen.
- The Arm Compute Library's thread pool is one per process, sized by the last network loaded.
  Sessions remember their count and, when another session changed it since, set it back before
  running (loading a one-layer network does that: ~1.5 ms under emulation, once per switch);
  runs are serialized by one lock so the count cannot change under a running network.
- Models: TFLite only. Debian's pyarmnn is built without the ONNX parser, so ONNX is refused
  with the reason. Inputs and outputs carry the TFLite tensor names LiteRT reports; int8/uint8
  tensors take and return float like the LiteRT session (``TensorSpec.quantization``).
- pyarmnn prints a deprecation notice on stdout, logs a warning per missing parser and its SWIG
  modules warn at import; all are swallowed (a ``--json`` command's stdout must stay JSON).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...errors import (
    BackendUnavailableError,
    ConfigError,
    InferenceError,
    ModelFormatError,
    ModelLoadError,
    StateError,
)
from ..base import Choice, LoadReport, SessionSpec, TensorSpec, format_shape
from ..memory import MemoryMeter, default_threads
from .common import BackendSession, finish_load, importable
from .litert_common import check_header, dequantize, quantize

logger = logging.getLogger("edgeinfer.runtime.armnn")  # its name before the move: users filter on it

INSTALL = ("apt install python3-pyarmnn libarmnn-cpuacc-backend33 libarmnntfliteparser24t64 "
           "(Debian 13 trixie, arm64)")
DEFAULT_DEVICE = "CpuAcc"
_ACL_DEVICES = ("CpuAcc",)  # the devices whose threads are the Arm Compute Library's pool
# ARM NN DataType names (pyarmnn's DataType_* constants) -> numpy dtype names.
_DTYPES = {"Float32": "float32", "Float16": "float16", "QAsymmU8": "uint8", "QAsymmS8": "int8",
           "QSymmS8": "int8", "QSymmS16": "int16", "Signed32": "int32", "Boolean": "bool"}

_import_lock = threading.Lock()
_pyarmnn: Any = None
_run_lock = threading.Lock()
_acl_threads = 0  # the Arm Compute Library pool's size as last set by us (0: unknown); _run_lock


def _import() -> Any:
    global _pyarmnn
    with _import_lock:
        if _pyarmnn is None:
            quiet = logging.getLogger("pyarmnn")
            level = quiet.level
            quiet.setLevel(logging.ERROR)
            try:
                # Its SWIG modules also warn (DeprecationWarning) at import on Python 3.12+.
                with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    import pyarmnn
            except ImportError as exc:
                raise BackendUnavailableError(
                    f"ARM NN is not installed ({exc}): {INSTALL}") from exc
            finally:
                quiet.setLevel(level)
            _pyarmnn = pyarmnn
    return _pyarmnn


@functools.cache
def _runtime() -> Any:
    # One IRuntime per process: it loads the backends once; every session's network lives in it.
    ann = _import()
    return ann.IRuntime(ann.CreationOptions())


def available() -> bool:
    """Whether pyarmnn imports here (Debian's arm64 packages; see ``INSTALL``)."""
    return importable(_import)


def version() -> str:
    """The ARM NN library's version (``33.0.0``: its ABI number, part of the selector's key).

    Raises:
        BackendUnavailableError: pyarmnn is not installed.
    """
    return str(_import().GetVersion())


def devices() -> tuple[str, ...]:
    """The ARM NN backends this build and machine provide (Debian trixie on arm64: CpuAcc).

    Raises:
        BackendUnavailableError: pyarmnn is not installed.
    """
    spec = _runtime().GetDeviceSpec()
    return tuple(sorted(str(b) for b in spec.GetSupportedBackends()))


def precisions(device: str = DEFAULT_DEVICE) -> tuple[str, ...]:
    """The ``Choice.precision`` values ``device`` runs here: ``fp32``, and ``fp16`` on CpuAcc
    where the CPU does FP16 vector arithmetic (``asimdhp``); nothing for a device not here.

    Raises:
        BackendUnavailableError: pyarmnn is not installed.
    """
    from ..providers import cpu_features

    if device not in devices():
        return ()
    if device in _ACL_DEVICES and "asimdhp" in cpu_features():
        return ("fp32", "fp16")
    return ("fp32",)


class ArmNNSession(BackendSession):
    """A network loaded into ARM NN's runtime behind the ``Session`` protocol. One caller at a
    time; runs of all ARM NN sessions in the process take turns.

    Attributes:
        inputs, outputs: TFLite tensor names, ARM NN's (fixed) shapes, dtypes, quantization.
        report: how the session was built.
        threads: CpuAcc's ``NumberOfThreads`` for this network.
        quantization: ``"int8"`` when inputs or outputs are quantized, else ``"float"``.
    """

    def __init__(self, network_id: int, bindings: tuple[list[Any], list[Any]],
                 report: LoadReport, threads: int, acl: bool, dequantize: bool) -> None:
        ann = _import()
        self._ann = ann
        self._id: int | None = network_id
        self.report = report
        self.threads = threads
        self._acl = acl
        in_bind, out_bind = bindings
        self.inputs = tuple(_tensor_spec(ann, name, info) for name, (_, info) in in_bind)
        self.outputs = tuple(_tensor_spec(ann, name, info) for name, (_, info) in out_bind)
        self._in = []
        for spec, (_, (bid, info)) in zip(self.inputs, in_bind):
            info.SetConstant()
            self._in.append((spec.name, bid, info, np.dtype(spec.dtype), spec.quantization))
        # Outputs are written into these buffers; run() hands out copies.
        self._out_tensors = ann.make_output_tensors([b for _, b in out_bind])
        self._out = [(spec.name, tuple(int(d) for d in spec.shape if d is not None),
                      spec.quantization if dequantize else None) for spec in self.outputs]
        quantized = any(s.quantization for s in (*self.inputs, *self.outputs))
        self.quantization = "int8" if quantized else "float"

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on feeds checked by ``check_feeds(..., accept_float_for_quantized=True)``.

        Raises:
            StateError: the session is closed.
            InferenceError: ARM NN failed.
        """
        ann = self._ann
        try:
            tensors = []
            for name, bid, info, dtype, quant in self._in:
                x = feeds[name]
                if quant is not None and x.dtype != dtype:
                    x = quantize(x, quant, dtype)
                # A view: pyarmnn marks the array it is given read-only, not the caller's.
                x = np.ascontiguousarray(x, dtype).view()
                tensors.append((bid, ann.ConstTensor(info, x)))
            with _run_lock:
                if self._id is None:
                    raise StateError("the ARM NN session is closed")
                if self._acl:
                    _use_threads(self.threads)
                _runtime().EnqueueWorkload(self._id, tensors, self._out_tensors)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise InferenceError(f"ARM NN failed to run the model: {_text(exc)}") from exc
        out: dict[str, np.ndarray] = {}
        for (name, shape, quant), (_, tensor) in zip(self._out, self._out_tensors):
            y = tensor.get_memory_area().reshape(shape)
            out[name] = y.copy() if quant is None else dequantize(y, quant)
        return out

    def close(self) -> None:
        """Unload the network from ARM NN's runtime. Idempotent."""
        with _run_lock:
            if self._id is not None:
                _runtime().UnloadNetwork(self._id)
                self._id = None


def _tensor_spec(ann: Any, name: str, info: Any) -> TensorSpec:
    kind = next((k for k, v in _DTYPES.items() if getattr(ann, f"DataType_{k}") ==
                 info.GetDataType()), None)
    if kind is None:
        raise ModelLoadError(f"tensor {name!r} has an ARM NN data type edgeinfer cannot feed "
                             f"({info.GetDataType()})")
    quant = None
    if info.IsQuantized() and info.GetQuantizationScale():
        quant = (float(info.GetQuantizationScale()), int(info.GetQuantizationOffset()))
    return TensorSpec(name=str(name), shape=tuple(int(d) for d in info.GetShape()),
                      dtype=_DTYPES[kind], quantization=quant)


def _use_threads(threads: int) -> None:
    """Size the Arm Compute Library's pool for the next run (caller holds ``_run_lock``).

    ARM NN sets it only while loading a network whose CpuAcc options name a count, so a
    one-layer network is loaded (and unloaded) with ours.
    """
    global _acl_threads
    if _acl_threads == threads:
        return
    ann = _import()
    net = ann.INetwork()
    source, relu, sink = (net.AddInputLayer(0), net.AddActivationLayer(ann.ActivationDescriptor()),
                          net.AddOutputLayer(0))
    info = ann.TensorInfo(ann.TensorShape((1,)), ann.DataType_Float32)
    source.GetOutputSlot(0).Connect(relu.GetInputSlot(0))
    relu.GetOutputSlot(0).Connect(sink.GetInputSlot(0))
    source.GetOutputSlot(0).SetTensorInfo(info)
    relu.GetOutputSlot(0).SetTensorInfo(info)
    runtime = _runtime()
    optimized, _ = ann.Optimize(net, [ann.BackendId("CpuAcc")], runtime.GetDeviceSpec(),
                                _options(ann, "fp32", threads))
    network_id, _ = runtime.LoadNetwork(optimized)
    runtime.UnloadNetwork(network_id)
    _acl_threads = threads


def _options(ann: Any, precision: str, threads: int) -> Any:
    options = ann.OptimizerOptions()
    options.m_ReduceFp32ToFp16 = precision == "fp16"
    acc = ann.BackendOptions(ann.BackendId("CpuAcc"))
    acc.AddOption(ann.BackendOption("NumberOfThreads", threads))
    options.m_ModelOptions = [acc]
    return options


def _text(exc: BaseException) -> str:
    return " | ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _check_choice(spec: SessionSpec, choice: Choice) -> None:
    if choice.backend != "armnn":
        raise ModelLoadError(f"the ARM NN backend was given a {choice.backend} choice")
    if spec.format != "tflite":
        raise ModelLoadError(
            f"ARM NN runs TFLite models here, not {spec.format}: Debian's pyarmnn is built "
            "without ARM NN's ONNX parser (IOnnxParser); use onnxruntime or OpenVINO for "
            f"{spec.path.name}"
        )
    have = devices()
    if choice.device not in have:
        raise ModelLoadError(f"ARM NN has no {choice.device} backend here (it has "
                             f"{', '.join(have) or 'none'})")
    offered = precisions(choice.device)
    if choice.precision not in offered:
        raise ModelLoadError(f"ARM NN's {choice.device} cannot run float layers in "
                             f"{choice.precision} on this CPU (it offers {', '.join(offered)})")


def _parse(ann: Any, spec: SessionSpec) -> tuple[Any, tuple[list[Any], list[Any]]]:
    parser = ann.ITfLiteParser()
    try:
        network = parser.CreateNetworkFromBinaryFile(str(spec.path))
        in_names = parser.GetSubgraphInputTensorNames(0)
        out_names = parser.GetSubgraphOutputTensorNames(0)
        bindings = ([(n, parser.GetNetworkInputBindingInfo(0, n)) for n in in_names],
                    [(n, parser.GetNetworkOutputBindingInfo(0, n)) for n in out_names])
    except RuntimeError as exc:
        text = _text(exc)
        if "Buffer doesn't conform" in text or "flatbuffer" in text.lower():
            raise ModelFormatError(f"{spec.path} is not a valid TFLite model: {text}") from exc
        raise ModelLoadError(f"ARM NN's TFLite parser refused {spec.path.name}: {text}") from exc
    declared = {name: tuple(int(d) for d in info.GetShape()) for name, (_, info) in bindings[0]}
    for name, shape in spec.input_shapes.items():
        if name not in declared:
            raise ConfigError(
                f"input_shapes names {name!r}; the model's inputs are {sorted(declared)}")
        if tuple(shape) != declared[name]:
            raise ModelLoadError(
                f"ARM NN runs {spec.path.name} at the shapes the file declares ({name} "
                f"{format_shape(declared[name])}), not input_shapes {format_shape(tuple(shape))}")
    return network, bindings


def open_session(spec: SessionSpec) -> ArmNNSession:
    """Parse ``spec.path`` with ARM NN's TFLite parser, optimize it for ``spec.choice`` (or
    CpuAcc fp32 at ``spec.threads``), load it and (with ``spec.warmup``) warm it up.

    Raises:
        BackendUnavailableError: pyarmnn is not installed.
        ModelNotFoundError, ModelFormatError: the file is missing or not a TFLite model.
        ModelLoadError: ARM NN cannot run it as asked (an ONNX file, a layer the device lacks,
            a precision or device not here); the selector skips the candidate.
        ConfigError: ``input_shapes`` names an input the model lacks.
    """
    global _acl_threads
    ann = _import()
    threads = spec.threads if spec.threads > 0 else default_threads()
    choice = spec.choice or Choice("armnn", DEFAULT_DEVICE, "fp32", threads)
    _check_choice(spec, choice)
    check_header(spec)
    meter = MemoryMeter()
    t0 = time.perf_counter()
    report = LoadReport(backend="armnn", provider=choice.provider, choice=choice,
                        requested=(choice.provider,))
    network, bindings = _parse(ann, spec)
    runtime = _runtime()
    acl = choice.device in _ACL_DEVICES
    with _run_lock:
        try:
            optimized, messages = ann.Optimize(network, [ann.BackendId(choice.device)],
                                               runtime.GetDeviceSpec(),
                                               _options(ann, choice.precision, choice.threads))
            network_id, note = runtime.LoadNetwork(optimized)
        except RuntimeError as exc:
            raise ModelLoadError(
                f"ARM NN could not load {spec.path.name} for {choice.label()}: {_text(exc)}"
            ) from exc
        if acl:
            _acl_threads = choice.threads
    for message in (*messages, note):
        if message:
            logger.info("%s: ARM NN: %s", spec.path.name, message)
    return finish_load(ArmNNSession(network_id, bindings, report, choice.threads, acl,
                                    spec.dequantize_outputs), spec, meter, t0)
