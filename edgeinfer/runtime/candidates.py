"""What the backend selector measures: every ``Choice`` worth trying for a model on this device.

onnxruntime's CPU provider fully optimized at 1, 2 and the cap of threads (spinning on and off
above one), its GPU/NPU providers; OpenVINO and ARM NN at each precision they offer here; LiteRT
with XNNPACK (fp32, fp16 where the CPU has FP16 arithmetic) and its delegates. ``providers`` and
``precision`` narrow the list; nothing asked for by name is dropped without a row saying why.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path

from ..errors import EdgeInferError
from .backends import BACKENDS, FORMATS, module
from .backends.onnx import import_ort
from .backends.tflite import delegate_libraries
from .base import Choice, SessionSpec
from .decision import Row, dist_version
from .providers import CPU, detect_platform, rank_providers

logger = logging.getLogger(__name__)


def thread_options(cap: int) -> list[int]:
    """1, 2 and the cap (a Pi 4's 4 cores: 1, 2, 4); tiny models often run fastest on one."""
    return sorted({t for t in (1, 2, cap) if 1 <= t <= cap})


def backend_available(name: str) -> bool:
    """Whether backend ``name``'s library is installed here: from its distributions' metadata
    where its row names them (no import), else by asking its module's ``available()``."""
    row = BACKENDS[name]
    if row.dists:
        return any(dist_version(d) is not None for d in row.dists) and \
            importlib.util.find_spec(row.module) is not None
    try:
        return module(name).available()
    except ImportError as exc:  # the module itself is gone (a partial install)
        logger.debug("backend %s: %s", name, exc)
        return False


def _precisions(name: str, allowed: str) -> list[str]:
    """The precisions backend ``name`` offers here, within what ``allowed`` permits."""
    if allowed == "fp32":
        return ["fp32"]
    try:
        offered = list(module(name).precisions())
    except (ImportError, AttributeError, EdgeInferError) as exc:
        logger.debug("%s offers no precisions: %s", name, exc)
        return ["fp32"]
    return [p for p in ("fp32", "bf16", "fp16") if p in offered or p == "fp32"]


def wanted_backends(providers: Sequence[str], fmt: str) -> tuple[set[str], list[str]]:
    """``providers`` (normalized) -> the backends to consider and the onnxruntime providers."""
    backends: set[str]
    if tuple(providers) == ("auto",):
        return {n for n, row in BACKENDS.items() if fmt in row.auto}, ["auto"]
    backends = set()
    eps: list[str] = []
    for p in providers:
        if p in BACKENDS:  # a whole backend named ("litert", "armnn", one registered)
            backends.add(p)
        elif p == "OpenVINOExecutionProvider":
            backends.add("openvino")
            eps.append(p)
        else:
            eps.append(p)
    if eps and fmt == "onnx":
        backends.add("onnxruntime")
    if eps and fmt == "tflite" and any(e in (CPU, "XnnpackExecutionProvider") for e in eps):
        backends.add("litert")
    return backends, eps


def candidates(spec: SessionSpec, small: bool = False) -> tuple[list[Choice], list[Row]]:
    """Every ``Choice`` worth measuring for ``spec``, most promising first, and the rows of the
    ones asked for that cannot run here (with the reason)."""
    cap = max(1, spec.threads)
    threads = thread_options(cap)
    backends, eps = wanted_backends(spec.providers, spec.format)
    out: list[Choice] = []
    skipped: list[Row] = []
    if spec.format == "onnx" and "onnxruntime" in backends:
        ort = import_ort()
        available = ort.get_available_providers()
        ranked = [c.name for c in rank_providers(available, "auto" if eps == ["auto"] else eps,
                                                 detect_platform())]
        if eps != ["auto"]:
            for name in eps:
                if name not in available and not (name == "OpenVINOExecutionProvider"
                                                   and "openvino" in backends):
                    skipped.append(Row(Choice("onnxruntime", name), "skipped",
                                       reason="not available in this onnxruntime build"))
        for name in ranked:
            if name == CPU:
                for t in sorted(threads, reverse=True):
                    out.append(Choice("onnxruntime", CPU, "fp32", t, "all", False))
                    if t > 1:
                        out.append(Choice("onnxruntime", CPU, "fp32", t, "all", True))
                if spec.precision == "int8" and _is_float_onnx(spec):
                    # weights quantized by onnxruntime itself (activations per run)
                    out.extend(Choice("onnxruntime", CPU, "int8", t, "all", False)
                               for t in sorted(threads, reverse=True))
            elif name == "OpenVINOExecutionProvider":
                out.append(Choice("onnxruntime", name, "fp32", cap))
            else:  # GPU/NPU providers: their own threads do not matter
                out.append(Choice("onnxruntime", name, "fp32", cap))
    if spec.format == "tflite" and "litert" in backends:
        for p in _precisions("litert", spec.precision):
            for t in sorted(threads, reverse=True):
                out.append(Choice("litert", "xnnpack", p, t))
        for d in delegate_libraries(spec):
            out.append(Choice("litert", d, "fp32", cap))
    limited = _address_space_limited()
    for name, row in BACKENDS.items():
        # the formats' own backends are above; the others are measured alike
        if name in FORMATS.values() or name not in backends or small \
                or spec.format not in row.formats:
            continue
        if row.address_space_hungry and limited:
            # OpenVINO's CPU plugin reserves far more address space than it uses: under
            # RLIMIT_AS (isolation: process with memory_limit_mb) it dies in a failed
            # allocation (SIGSEGV) and takes the worker with it.
            skipped.append(Row(Choice(name, row.device), "skipped",
                               reason="not measured under an address-space limit "
                                      "(isolation: process with memory_limit_mb)"))
            continue
        if not backend_available(name):
            if eps != ["auto"] or name in spec.providers:
                skipped.append(Row(Choice(name, row.device), "skipped",
                                   reason=f"{name} is not installed"))
            continue
        for p in _precisions(name, spec.precision):
            for t in sorted(threads, reverse=True):
                out.append(Choice(name, row.device, p, t))
    # Most promising first: the configured cap of threads, then reduced precision last.
    out.sort(key=lambda c: (c.threads != cap, c.precision != "fp32", c.spin))
    return list(dict.fromkeys(out)), skipped


def admissible(spec: SessionSpec, choice: Choice) -> str:
    """Why ``choice`` could never have been a candidate for ``spec`` ("" if it could): a cached
    decision is checked with this before it is opened, so a decision file cannot make the
    daemon load a library no config or discovery named, or exceed the thread cap or precision."""
    if choice.backend not in BACKENDS:  # a backend registered when it was written, not now
        return f"no backend {choice.backend!r} is registered (known: {', '.join(BACKENDS)})"
    if spec.format not in BACKENDS[choice.backend].formats:
        return f"{choice.backend} reads no {spec.format} models"
    if choice.threads > max(1, spec.threads):
        return f"{choice.threads} threads is over the cap of {spec.threads}"
    allowed = {"fp32"} if spec.precision == "fp32" else {"fp32", "bf16", "fp16"}
    if spec.precision == "int8":
        allowed.add("int8")
    if choice.precision not in allowed:
        return f"precision {choice.precision} is not allowed by precision: {spec.precision}"
    if choice.backend == "litert" and choice.device != "xnnpack" \
            and choice.device not in delegate_libraries(spec):
        return f"delegate {choice.device} is neither configured nor found on this device"
    if choice.backend == "onnxruntime" and not choice.device.endswith("ExecutionProvider"):
        return f"{choice.device} is not an onnxruntime execution provider"
    return ""


def _address_space_limited() -> bool:
    """Whether this process runs under RLIMIT_AS (an isolated worker with a memory limit)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return soft != resource.RLIM_INFINITY


def _is_float_onnx(spec: SessionSpec) -> bool:
    """An ONNX model with no quantized operators."""
    return _float_onnx(str(spec.path), spec.sha256)


@functools.lru_cache(maxsize=64)
def _float_onnx(path: str, sha256: str) -> bool:  # sha256: a changed file is looked at again
    from .modelfile import inspect_model

    try:
        info = inspect_model(Path(path), digest=False)
    except EdgeInferError:
        return False
    return info.onnx is not None and info.onnx.quantization == "float"


def reference_choice(spec: SessionSpec) -> Choice:
    """The configuration whose outputs are the truth: the plain fp32 kernels of the model's own
    runtime (onnxruntime's CPU provider with basic optimizations; LiteRT's XNNPACK in fp32).
    A quantized ONNX model's truth is its integer execution as raw onnxruntime runs it (fully
    optimized: QDQ pairs fused into integer kernels), not the float simulation of its QDQ
    nodes that basic optimization runs: the two differ by quantization steps (0.031 of the
    range on YOLOv8n INT8), which no backend can be asked to match."""
    if spec.format == "onnx":
        opt = "basic" if _is_float_onnx(spec) else "all"
        return Choice("onnxruntime", CPU, "fp32", max(1, spec.threads), opt, False)
    return Choice("litert", "xnnpack", "fp32", max(1, spec.threads))


def default_choice(spec: SessionSpec) -> Choice:
    """What serves before (or without) measuring: onnxruntime's CPU provider fully optimized,
    spinning off; LiteRT with XNNPACK."""
    if spec.format == "onnx":
        return Choice("onnxruntime", CPU, "fp32", max(1, spec.threads), "all", False)
    return Choice("litert", "xnnpack", "fp32", max(1, spec.threads))
