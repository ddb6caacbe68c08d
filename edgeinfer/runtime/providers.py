"""Execution-provider choice: a pure ranking function, the platform facts it reads, and the
explanation ``edgeinfer providers`` prints.

Ranking never touches hardware (unit-tested with made-up lists); creating sessions on the ranked
candidates and checking which provider really runs is ``runtime/backends/onnx.py``'s job.

Order for ``providers="auto"``: TensorRT (FP16, engine and timing caches in the state directory)
> CUDA > other GPU/NPU providers > XNNPACK / ACL / other accelerated CPU providers > CPU.
The ArmNN execution provider was removed from onnxruntime; ARM NN is its own backend
(``runtime/backends/armnn.py`` through pyarmnn, for TFLite models) or a TFLite delegate.
``"litert"`` and ``"armnn"`` (and any backend registered in ``runtime/backends/``) name whole backends:
``runtime/select.py`` measures them beside onnxruntime's providers; ranking here is about
onnxruntime's providers only.
"""

from __future__ import annotations

import functools
import platform as _platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import ConfigError
from .backends import BACKENDS
from .base import Fallback

CPU = "CPUExecutionProvider"

ALIASES: dict[str, str] = {
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "migraphx": "MIGraphXExecutionProvider",
    "rocm": "ROCMExecutionProvider",
    "qnn": "QNNExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "xnnpack": "XnnpackExecutionProvider",
    "acl": "ACLExecutionProvider",
    "dnnl": "DnnlExecutionProvider",
    "cpu": CPU,
    # Whole backends beside onnxruntime go by their name in the backends table
    # (``runtime/backends/__init__.py``); ``runtime/select.py`` measures them.
    "tflite": "litert",
}

# Rank for "auto": lower is better. A provider missing here is never picked by "auto" (it can
# still be named explicitly).
_RANK: dict[str, int] = {
    "TensorrtExecutionProvider": 0,
    "CUDAExecutionProvider": 1,
    "MIGraphXExecutionProvider": 2,
    "ROCMExecutionProvider": 3,
    "QNNExecutionProvider": 4,
    "OpenVINOExecutionProvider": 5,
    "XnnpackExecutionProvider": 6,
    "ACLExecutionProvider": 7,
    "DnnlExecutionProvider": 8,
    CPU: 99,
}

_NOT_AUTO: dict[str, str] = {
    "AzureExecutionProvider": "runs inference on a remote endpoint, never chosen automatically",
    "ArmNNExecutionProvider": "removed from onnxruntime; use providers: armnn (pyarmnn, TFLite)",
}

_ARM_ONLY = {"ACLExecutionProvider"}


@dataclass(frozen=True, slots=True)
class PlatformInfo:
    """The facts about the machine that ranking and caching depend on."""

    machine: str  # platform.machine(): "aarch64", "x86_64", ...
    board: str = ""  # device-tree model, e.g. "Raspberry Pi 4 Model B Rev 1.4"
    cpu_model: str = ""
    is_jetson: bool = False

    @property
    def is_arm(self) -> bool:
        return self.machine.lower() in ("aarch64", "arm64") or self.machine.lower().startswith("arm")


class Candidate(NamedTuple):
    """A provider to try, with its provider options."""

    name: str
    options: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ProviderContext:
    """Values that provider options depend on."""

    state_dir: Path | None = None
    threads: int = 1
    memory_limit_mb: float | None = None


def whole_backends() -> frozenset[str]:
    """The backends ``providers`` names as a whole (``litert``, ``armnn``, one registered):
    every row of the backends table but onnxruntime, which is named by its execution providers
    (OpenVINO too, through ``OpenVINOExecutionProvider``: the alias ``openvino`` means both)."""
    return frozenset(BACKENDS) - {"onnxruntime", "openvino"}


def normalize(names: str | Iterable[str]) -> tuple[str, ...]:
    """``"auto"``, ``"cuda"``, ``["tensorrt", "cpu"]`` or full provider names -> a tuple of
    onnxruntime provider names, or ``("auto",)``.

    Raises:
        ConfigError: an unknown alias (full ``...ExecutionProvider`` names pass through).
    """
    items = names.split(",") if isinstance(names, str) else list(names)
    out: list[str] = []
    for n in items:
        key = str(n).strip()
        if key.lower() == "auto":
            if len(items) != 1:
                raise ConfigError("providers: 'auto' cannot be combined with other providers")
            return ("auto",)
        if key.endswith("ExecutionProvider"):
            out.append(key)
        elif key.lower() in ALIASES:
            out.append(ALIASES[key.lower()])
        elif key.lower() in whole_backends():
            out.append(key.lower())
        else:
            valid = ", ".join(["auto", *sorted(set(ALIASES) | whole_backends())])
            raise ConfigError(f"unknown provider {key!r}; valid: {valid} or a full onnxruntime name")
    if not out:
        raise ConfigError("providers: the list is empty")
    return tuple(dict.fromkeys(out))


def rank_providers(
    available: Sequence[str],
    preference: str | Sequence[str] = "auto",
    platform: PlatformInfo | None = None,
    context: ProviderContext | None = None,
) -> list[Candidate]:
    """Order the providers to try, best first, each with its options.

    With ``"auto"`` every available, rankable provider in rank order; with an explicit list, the
    available ones in the order given. The CPU provider is always last (it is the fallback
    onnxruntime itself uses), unless ``preference`` names it earlier.
    """
    platform = platform or PlatformInfo(machine="unknown")
    context = context or ProviderContext()
    wanted = normalize(preference) if isinstance(preference, str) else normalize(list(preference))
    avail = set(available)
    if wanted == ("auto",):
        names = sorted(
            (p for p in avail if p in _RANK and _usable_on(p, platform)), key=_RANK.__getitem__
        )
    else:
        names = [p for p in wanted if p in avail and p not in whole_backends()]
    if CPU not in names:
        names.append(CPU)
    return [Candidate(n, provider_options(n, platform, context)) for n in names]


def skipped_providers(
    available: Sequence[str], preference: str | Sequence[str], platform: PlatformInfo | None = None
) -> list[Fallback]:
    """Providers explicitly asked for that cannot be tried here, with the reason."""
    platform = platform or PlatformInfo(machine="unknown")
    wanted = normalize(preference) if isinstance(preference, str) else normalize(list(preference))
    if wanted == ("auto",):
        return []
    out = []
    for p in wanted:
        if p in whole_backends():
            continue
        if p not in available:
            out.append(Fallback(p, "not available in this onnxruntime build"))
        elif not _usable_on(p, platform):
            out.append(Fallback(p, f"not usable on {platform.machine}"))
    return out


def _usable_on(provider: str, platform: PlatformInfo) -> bool:
    return not (provider in _ARM_ONLY and not platform.is_arm and platform.machine != "unknown")


def provider_options(name: str, platform: PlatformInfo, context: ProviderContext) -> dict[str, Any]:
    """Options for one provider on this platform (caches in the state directory, thread counts)."""
    if name == "TensorrtExecutionProvider":
        opts: dict[str, Any] = {"trt_fp16_enable": True}
        if context.state_dir is not None:
            trt = context.state_dir / "tensorrt"
            opts.update(
                trt_engine_cache_enable=True,
                trt_engine_cache_path=str(trt / "engines"),
                trt_timing_cache_enable=True,
                trt_timing_cache_path=str(trt),
            )
        return opts
    if name == "CUDAExecutionProvider":
        opts = {"arena_extend_strategy": "kSameAsRequested", "cudnn_conv_algo_search": "HEURISTIC"}
        if context.memory_limit_mb:
            opts["gpu_mem_limit"] = int(context.memory_limit_mb * 1024 * 1024)
        return opts
    if name == "XnnpackExecutionProvider":
        return {"intra_op_num_threads": max(1, context.threads)}
    return {}


def explain(
    available: Sequence[str], platform: PlatformInfo, preference: str | Sequence[str] = "auto"
) -> list[dict[str, Any]]:
    """One row per provider known or available: is it available, its auto rank, and a note."""
    auto = [c.name for c in rank_providers(available, preference, platform)]
    rows = []
    for name in sorted(set(_RANK) | set(available) | set(_NOT_AUTO), key=lambda n: _RANK.get(n, 50)):
        is_avail = name in available
        if name in _NOT_AUTO:
            note = _NOT_AUTO[name]
        elif not is_avail:
            note = "not in this onnxruntime build"
        elif name not in _RANK:
            note = "available but not ranked: name it explicitly to use it"
        elif not _usable_on(name, platform):
            note = f"not usable on {platform.machine}"
        else:
            note = "will be tried" if name in auto else "available"
        rows.append({
            "name": name,
            "available": is_avail,
            "order": auto.index(name) + 1 if name in auto else None,
            "note": note,
        })
    return rows


@functools.lru_cache(maxsize=1)
def cpu_features() -> frozenset[str]:
    """The CPU's feature flags (x86 ``flags``, Arm ``Features``) from /proc/cpuinfo, once."""
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_features_digest() -> str:
    """A short digest of ``cpu_features()``: part of every key whose entry is CPU-specific."""
    import hashlib

    return hashlib.sha256(" ".join(sorted(cpu_features())).encode()).hexdigest()[:12]


@functools.lru_cache(maxsize=1)
def detect_platform() -> PlatformInfo:
    """Read the machine, board, CPU model and whether this is a Jetson, once per process."""
    board = _read("/proc/device-tree/model").rstrip("\x00").strip()
    cpu = ""
    for line in _read("/proc/cpuinfo").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
            cpu = value.strip()
            break
    if not cpu:
        cpu = _platform.processor() or _platform.machine()
    jetson = "jetson" in board.lower() or Path("/etc/nv_tegra_release").exists()
    return PlatformInfo(machine=_platform.machine(), board=board, cpu_model=cpu, is_jetson=jetson)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""
