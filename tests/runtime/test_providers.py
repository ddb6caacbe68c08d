"""Provider ranking is a pure function: every case runs here without the hardware."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.errors import ConfigError
from edgeinfer.runtime.providers import (
    CPU,
    PlatformInfo,
    ProviderContext,
    explain,
    normalize,
    rank_providers,
    skipped_providers,
)

JETSON = PlatformInfo(machine="aarch64", board="NVIDIA Jetson Orin Nano", is_jetson=True)
PI4 = PlatformInfo(machine="aarch64", board="Raspberry Pi 4 Model B Rev 1.4")
X86 = PlatformInfo(machine="x86_64", cpu_model="Intel Xeon")
JETSON_EPS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


def names(cands) -> list[str]:
    return [c.name for c in cands]


@pytest.mark.arm64
def test_auto_on_a_jetson_prefers_tensorrt_then_cuda_then_cpu() -> None:
    ctx = ProviderContext(state_dir=Path("/var/lib/edgeinfer"), threads=4)
    cands = rank_providers(list(reversed(JETSON_EPS)), "auto", JETSON, ctx)
    assert names(cands) == JETSON_EPS
    trt = cands[0].options
    assert trt["trt_fp16_enable"] is True
    assert trt["trt_engine_cache_path"] == "/var/lib/edgeinfer/tensorrt/engines"
    assert trt["trt_timing_cache_path"] == "/var/lib/edgeinfer/tensorrt"


@pytest.mark.arm64
def test_auto_on_a_pi_puts_accelerated_cpu_providers_before_cpu() -> None:
    avail = ["CPUExecutionProvider", "ACLExecutionProvider", "XnnpackExecutionProvider"]
    cands = rank_providers(avail, "auto", PI4, ProviderContext(threads=3))
    assert names(cands) == ["XnnpackExecutionProvider", "ACLExecutionProvider", CPU]
    assert cands[0].options == {"intra_op_num_threads": 3}


def test_arm_only_providers_are_not_ranked_on_x86() -> None:
    avail = ["ACLExecutionProvider", "CPUExecutionProvider"]
    assert names(rank_providers(avail, "auto", X86)) == [CPU]
    assert skipped_providers(avail, ["acl"], X86)[0].reason == "not usable on x86_64"


def test_remote_and_unranked_providers_are_never_auto() -> None:
    avail = ["AzureExecutionProvider", "SomeVendorExecutionProvider", "CPUExecutionProvider"]
    assert names(rank_providers(avail, "auto", X86)) == [CPU]
    rows = {r["name"]: r for r in explain(avail, X86)}
    assert "remote" in rows["AzureExecutionProvider"]["note"]
    assert "not ranked" in rows["SomeVendorExecutionProvider"]["note"]
    assert rows["CPUExecutionProvider"]["order"] == 1
    assert rows["TensorrtExecutionProvider"]["available"] is False


def test_explicit_preference_keeps_its_order_and_drops_the_unavailable() -> None:
    avail = JETSON_EPS
    assert names(rank_providers(avail, ["cuda", "tensorrt"], JETSON)) == [
        "CUDAExecutionProvider", "TensorrtExecutionProvider", CPU]
    assert names(rank_providers(["CPUExecutionProvider"], "cuda,cpu", X86)) == [CPU]
    skipped = skipped_providers(["CPUExecutionProvider"], "cuda", X86)
    assert [(f.provider, f.reason) for f in skipped] == [
        ("CUDAExecutionProvider", "not available in this onnxruntime build")]


def test_cuda_memory_limit_becomes_gpu_mem_limit() -> None:
    cands = rank_providers(JETSON_EPS, "cuda", JETSON, ProviderContext(memory_limit_mb=256))
    assert cands[0].options["gpu_mem_limit"] == 256 * 1024 * 1024
    assert cands[0].options["arena_extend_strategy"] == "kSameAsRequested"


def test_normalize_aliases_and_errors() -> None:
    assert normalize("auto") == ("auto",)
    assert normalize("TRT, cpu") == ("TensorrtExecutionProvider", CPU)
    assert normalize(["cuda", "CUDAExecutionProvider"]) == ("CUDAExecutionProvider",)
    with pytest.raises(ConfigError, match="unknown provider 'gpu'.*tensorrt"):
        normalize("gpu")
    with pytest.raises(ConfigError, match="cannot be combined"):
        normalize(["auto", "cpu"])
    # ARM NN and LiteRT are whole backends (measured by runtime/select.py), not providers
    assert normalize(["armnn", "tflite", "litert"]) == ("armnn", "litert")


def test_the_platform_and_cpu_topology_are_read_once_per_process(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgeinfer.runtime import memory, providers

    reads: list[str] = []
    real_read = providers._read
    monkeypatch.setattr(providers, "_read", lambda p: reads.append(p) or real_read(p))
    providers.detect_platform.cache_clear()
    assert providers.detect_platform() == providers.detect_platform()
    assert reads.count("/proc/cpuinfo") == 1
    providers.detect_platform.cache_clear()

    opened: list[str] = []

    def counting_open(path: str, *a: object, **kw: object) -> object:
        opened.append(path)
        return open(path, *a, **kw)

    monkeypatch.setattr(memory, "open", counting_open, raising=False)
    memory._cores_of.cache_clear()
    assert memory.physical_cores() == memory.physical_cores() >= 1
    first = len(opened)
    assert first > 0 or not Path("/sys/devices/system/cpu/cpu0/topology").exists()
    memory.physical_cores()
    assert len(opened) == first  # the topology files are not read again
    memory._cores_of.cache_clear()
