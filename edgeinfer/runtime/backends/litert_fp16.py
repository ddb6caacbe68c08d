"""LiteRT's ``CompiledModel`` on XNNPACK with FP16 inference forced: the ``fp16`` LiteRT choice.

XNNPACK's ``TFLITE_XNNPACK_DELEGATE_FLAG_FORCE_FP16`` runs a float model's layers in half
precision where the CPU has FP16 arithmetic (a Pi 5's Cortex-A76; x86 with AVX512-FP16). The
``Interpreter`` API of ai-edge-litert has no way to set XNNPACK flags; its ``CompiledModel`` API
takes them in ``CpuOptions.xnnpack_flags``. Names, shapes and quantization come from the
interpreter's view of the same file, so this session takes and returns what ``TFLiteSession``
does. Opened by ``runtime/tflite.py`` for ``Choice("litert", "xnnpack", "fp16", threads)``.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..._stderr import native_logs_to_debug
from ...errors import InferenceError, ModelLoadError, StateError
from ..base import LoadReport, SessionSpec
from .common import BackendSession
from .litert_common import (
    check_input_shape,
    dequantize,
    model_error,
    quantization_of,
    quantize,
    tensor_spec,
    error_text,
)

# tensorflow/lite/delegates/xnnpack/xnnpack_delegate.h: QS8 | QU8 (LiteRT's defaults) | FORCE_FP16
XNNPACK_FP16_FLAGS = 0x1 | 0x2 | 0x4


@functools.cache
def _environment() -> Any:
    atexit.register(_destroy_environment)
    return _create_environment()


def _destroy_environment() -> None:
    """At exit: destroy our environment with its farewell lines ("DestroyAccelerator: ...")
    sent to the debug log. LiteRT also keeps a default environment of its own, built by the
    first run, which says the same from a C++ static destructor after Python is gone: so the
    last thing this does is point fd 2 at /dev/null. It runs after the threading exit hooks
    (measuring stopped) and before the atexit hooks registered earlier (logging's final
    flush, whose streams are flushed at every record anyway)."""
    import gc

    with native_logs_to_debug():
        _environment.cache_clear()
        gc.collect()
    try:
        sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _create_environment() -> Any:
    """One LiteRT environment per process, with no vendor compiler or dispatch plugins: the
    default one looks for them in the wheel (it tries to load OpenVINO's) on every model."""
    import ai_edge_litert
    from ai_edge_litert.environment import Environment, EnvironmentOptions

    here = str(Path(ai_edge_litert.__file__).parent)
    return Environment.create(options=EnvironmentOptions(
        runtime_path=here, compiler_plugin_path=here, dispatch_library_path=here))


class CompiledSession(BackendSession):
    """A LiteRT ``CompiledModel`` on XNNPACK with FP16 inference forced (the ``Session``
    protocol). Inputs, outputs and their quantization are the interpreter's, so it takes and
    returns what :class:`TFLiteSession` does (``quantization`` too). One caller at a time."""

    def __init__(self, mod: Any, spec: SessionSpec, threads: int, report: LoadReport) -> None:
        with native_logs_to_debug():  # LiteRT logs every accelerator it registers
            self._open(mod, spec, threads, report)

    def _open(self, mod: Any, spec: SessionSpec, threads: int, report: LoadReport) -> None:
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.options import CpuOptions, Options

        try:
            details = mod.Interpreter(model_path=str(spec.path))  # not allocated: names only
            in_details, out_details = details.get_input_details(), details.get_output_details()
            self.quantization = quantization_of(details, in_details, out_details)
            del details
            options = Options(cpu_options=CpuOptions(num_threads=threads,
                                                     xnnpack_flags=XNNPACK_FP16_FLAGS))
            model = CompiledModel.from_file(str(spec.path), environment=_environment(),
                                            options=options)
            for name, shape in spec.input_shapes.items():
                check_input_shape({d["name"]: d for d in in_details}, name, shape)
                index = next(i for i, d in enumerate(in_details) if d["name"] == name)
                model.resize_input_tensor(index, list(shape))
        except (ValueError, RuntimeError) as exc:
            raise model_error(spec, exc) from exc
        self._key = next(iter(model.get_signature_list()))
        for kind, want, got in (
            ("inputs", in_details, model.get_input_tensor_details(self._key)),
            ("outputs", out_details, model.get_output_tensor_details(self._key)),
        ):
            # Buffers go by the signature's order; refuse rather than feed the wrong tensor.
            if [int(d["index"]) for d in want] != [int(d["index"]) for d in got.values()]:
                raise ModelLoadError(f"{spec.path.name}: the signature's {kind} are not in the "
                                     "interpreter's order; LiteRT fp16 cannot run it here")
        self._model: Any = model
        self.report = report
        self.threads = threads
        self.inputs = tuple(tensor_spec(d) for d in in_details)
        self.outputs = tuple(tensor_spec(d) for d in out_details)
        self._dequantize = spec.dequantize_outputs
        self._ran = False
        self._shapes: list[tuple[int, ...]] = []
        self._buffers()

    def _buffers(self) -> None:
        """(Re)create the tensor buffers for the model's current shapes."""
        m = self._model
        ins, outs = m.get_input_tensor_details(self._key), m.get_output_tensor_details(self._key)
        self._shapes = [tuple(int(n) for n in d["shape"]) for d in ins.values()]
        self._out_shapes = [tuple(int(n) for n in d["shape"]) for d in outs.values()]
        self._in_buffers = m.create_input_buffers(0)
        self._out_buffers = m.create_output_buffers(0)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once, as ``TFLiteSession.run`` does: the same feeds, outputs and errors."""
        m = self._model
        if m is None:
            raise StateError("the TFLite session is closed")
        if not self._ran:  # LiteRT's first run builds and logs a default environment
            self._ran = True
            with native_logs_to_debug():
                return self.run(feeds)
        try:
            values = []
            for i, s in enumerate(self.inputs):
                x = feeds[s.name]
                if s.quantization is not None and x.dtype != np.dtype(s.dtype):
                    x = quantize(x, s.quantization, np.dtype(s.dtype))
                if x.shape != self._shapes[i]:
                    m.resize_input_tensor(i, list(x.shape))
                    self._buffers()
                values.append(x)
            for buf, x in zip(self._in_buffers, values):
                buf.write(x)
            m.run_by_index(0, self._in_buffers, self._out_buffers)
            out: dict[str, np.ndarray] = {}
            for s, buf, shape in zip(self.outputs, self._out_buffers, self._out_shapes):
                y = buf.read(int(np.prod(shape)), np.dtype(s.dtype)).reshape(shape)
                if self._dequantize and s.quantization is not None:
                    y = dequantize(y, s.quantization)
                out[s.name] = y
            return out
        except (ValueError, RuntimeError) as exc:
            raise InferenceError(f"LiteRT failed to run the model: {error_text(exc)}") from exc

    def close(self) -> None:
        """Release the compiled model and its buffers. Idempotent."""
        with native_logs_to_debug():
            self._model = None
            self._in_buffers = self._out_buffers = []
