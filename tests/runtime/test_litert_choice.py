"""LiteRT opening one exact ``Choice`` (XNNPACK fp32/fp16 at given threads, one delegate), and the
delegate discovery finding Mesa's Teflon where Debian installs it."""

from __future__ import annotations

import ctypes.util
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

from edgeinfer.errors import ConfigError, ModelLoadError, StateError
from edgeinfer.runtime.backends import tflite
from edgeinfer.runtime.base import Choice, DelegateSpec, SessionSpec, check_feeds
from edgeinfer.runtime.backends.delegates import KNOWN_DELEGATES, delegate_name, discover_delegates
from edgeinfer.runtime.backends.litert_fp16 import CompiledSession
from edgeinfer.testing import tflite_models as tm

Open = Callable[..., Any]
FP16 = "fp16" in tflite.precisions()
needs_fp16 = pytest.mark.skipif(not FP16, reason="this CPU has no FP16 arithmetic for XNNPACK")


@pytest.fixture
def open_lite() -> Iterator[Open]:
    """``open_lite(path, choice, **spec_fields)``: a session closed at the end of the test."""
    sessions: list[Any] = []

    def _open(path: Path, choice: Choice | None, **kw: Any) -> Any:
        kw.setdefault("threads", 1)
        spec = SessionSpec(path=Path(path), format="tflite", sha256="0" * 64, choice=choice, **kw)
        session = tflite.open_session(spec)
        sessions.append(session)
        return session

    yield _open
    for s in sessions:
        s.close()


def _run(session: Any, feeds: Any) -> dict[str, np.ndarray]:
    return dict(session.run(check_feeds(session.inputs, feeds, accept_float_for_quantized=True)))


def _raw(path: Path, x: np.ndarray, threads: int) -> dict[str, np.ndarray]:
    raw = Interpreter(str(path), num_threads=threads)
    raw.allocate_tensors()
    raw.set_tensor(raw.get_input_details()[0]["index"], x)
    raw.invoke()
    return {d["name"]: raw.get_tensor(d["index"]) for d in raw.get_output_details()}


def _face(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)


def test_available_and_precisions() -> None:
    assert tflite.available()
    assert tflite.precisions()[0] == "fp32"
    assert set(tflite.precisions()) <= {"fp32", "fp16"}


@pytest.mark.parametrize(
    ("features", "fp16"),
    [
        ("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid "
         "asimdrdm lrcpc dcpop asimddp", True),  # Raspberry Pi 5, Cortex-A76
        ("Features\t: fp asimd evtstrm crc32 cpuid", False),  # Raspberry Pi 4, Cortex-A72
        ("flags\t\t: fpu sse sse2 avx2 f16c avx512f avx512_bf16 avx512_fp16", True),
        ("flags\t\t: fpu sse sse2 avx2 f16c avx512f", False),  # F16C converts, no arithmetic
        ("processor\t: 0", False),
    ],
)
def test_fp16_arithmetic_from_cpuinfo(features: str, fp16: bool, tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\n{features}\n")
    assert tflite._cpu_has_fp16(str(cpuinfo)) is fp16
    assert tflite._cpu_has_fp16(str(tmp_path / "missing")) is False


def test_xnnpack_fp32_choice_runs_at_its_threads(blazeface_path: Path, open_lite: Open) -> None:
    choice = Choice("litert", "xnnpack", "fp32", threads=2)
    session = open_lite(blazeface_path, choice, threads=1)  # the choice's threads win
    assert isinstance(session, tflite.TFLiteSession) and session.threads == 2
    report = session.report
    assert (report.backend, report.provider, report.choice) == ("litert", "xnnpack", choice)
    assert report.fallbacks == [] and report.warmed_up and report.load_ms > 0
    x = _face(1)
    got, want = _run(session, x), _raw(blazeface_path, x, 2)
    for name, y in want.items():
        np.testing.assert_array_equal(got[name], y)


def test_without_a_choice_nothing_changes(blazeface_path: Path, open_lite: Open) -> None:
    session = open_lite(blazeface_path, None, threads=2)
    assert isinstance(session, tflite.TFLiteSession) and session.threads == 2
    assert (session.report.backend, session.report.provider) == ("tflite", "xnnpack")
    assert session.report.choice is None


@needs_fp16
def test_xnnpack_fp16_is_close_to_fp32_but_not_it(blazeface_path: Path, open_lite: Open) -> None:
    choice = Choice("litert", "xnnpack", "fp16", threads=2)
    session = open_lite(blazeface_path, choice)
    assert isinstance(session, CompiledSession) and session.threads == 2
    assert session.provider == "xnnpack" and session.report.choice == choice
    assert session.report.warmed_up and session.quantization == "float16"
    fp32 = open_lite(blazeface_path, Choice("litert", "xnnpack", "fp32", 2))
    assert [(s.name, s.shape, s.dtype) for s in session.inputs] == [
        (s.name, s.shape, s.dtype) for s in fp32.inputs]
    assert session.outputs == fp32.outputs
    differs = False
    for seed in range(3):
        x = _face(seed)
        got, want = _run(session, x), _run(fp32, x)
        np.testing.assert_array_equal(_run(session, x)["regressors"], got["regressors"])
        for name, y in want.items():
            assert got[name].shape == y.shape and got[name].dtype == np.float32
            span = float(y.max() - y.min())
            # FP16 keeps ~3 significant digits; regressors are in pixels (span ~300)
            assert np.abs(got[name] - y).max() <= 0.01 * span, name
            differs |= not np.array_equal(got[name], y)
    assert differs  # the FP16 flag reached XNNPACK: the arithmetic changed


@needs_fp16
def test_fp16_session_resizes_and_quantizes_like_the_interpreter(
    tmp_path: Path, open_lite: Open
) -> None:
    fp16 = Choice("litert", "xnnpack", "fp16", 1)
    session = open_lite(tm.add_model(tmp_path / "add.tflite", dynamic_batch=True), fp16)
    assert session.inputs[0].shape == (None, 4)
    for batch in (3, 1, 5):
        x = np.random.default_rng(batch).normal(size=(batch, 4)).astype(np.float32)
        # inputs and sums rounded to fp16: half an ulp of values up to ~5 is ~2e-3
        np.testing.assert_allclose(_run(session, x)["y"], tm.add_reference(x), atol=4e-3)
    fixed = open_lite(tm.reshape_model(tmp_path / "reshape.tflite"), fp16,
                      input_shapes={"x": (2, 4)})
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_run(fixed, x)["y"], x.reshape(8))
    with pytest.raises(ConfigError, match="does not fit"):
        open_lite(tm.reshape_model(tmp_path / "r2.tflite"), fp16, input_shapes={"x": (2, 5)})
    path = tm.int8_fc_model(tmp_path / "int8.tflite")
    q = open_lite(path, fp16)
    ref = open_lite(path, None)
    assert q.inputs == ref.inputs and q.outputs == ref.outputs and q.quantization == "int8"
    step = tm.INT8_FC_OUTPUT[0]
    for x in np.random.default_rng(3).uniform(-1, 1, (5, 1, 4)).astype(np.float32):
        np.testing.assert_allclose(_run(q, x)["y"], _run(ref, x)["y"], atol=step * 1.01)
    q.close()
    q.close()
    with pytest.raises(StateError):
        q.run({"x": np.zeros((1, 4), np.float32)})


def test_a_choice_never_falls_back(tmp_path: Path, open_lite: Open) -> None:
    path = tm.add_model(tmp_path / "add.tflite")
    with pytest.raises(ModelLoadError, match="delegate /nonexistent/libfoo.so cannot be loaded"):
        open_lite(path, Choice("litert", "/nonexistent/libfoo.so"))
    libm = ctypes.util.find_library("m")
    if libm is not None:
        with pytest.raises(ModelLoadError, match="not a TFLite external delegate"):
            open_lite(path, Choice("litert", libm))
    with pytest.raises(ModelLoadError, match="not 'bf16'"):
        open_lite(path, Choice("litert", "xnnpack", "bf16"))
    with pytest.raises(ModelLoadError, match="given a openvino choice"):
        open_lite(path, Choice("openvino", "CPU"))
    if not FP16:
        with pytest.raises(ModelLoadError, match="cannot run fp16 here"):
            open_lite(path, Choice("litert", "xnnpack", "fp16"))


# --- Mesa Teflon in the delegate discovery -----------------------------------------------------


def test_teflon_is_found_where_debian_installs_it(tmp_path: Path) -> None:
    """``mesa-teflon-delegate`` 25.0.7 (trixie, arm64 only) ships ``/usr/lib/teflon/libteflon.so``
    (``dpkg -c``); its dynamic symbols include both ``tflite_plugin_*`` entry points."""
    asked: list[str] = []

    def nothing(name: str) -> str | None:
        asked.append(name)
        return None

    assert discover_delegates(root=str(tmp_path), find_library=nothing) == ()
    assert "" not in asked and "teflon" not in asked  # not on the linker path: never asked
    teflon = tmp_path / "usr" / "lib" / "teflon" / "libteflon.so"
    teflon.parent.mkdir(parents=True)
    teflon.write_bytes(b"")
    assert discover_delegates(root=str(tmp_path), find_library=nothing) == (
        DelegateSpec(str(teflon), {}),)
    assert delegate_name(str(teflon)) == "teflon"
    assert Choice("litert", str(teflon)).provider == "libteflon.so"
    # An NPU ranks before ARM NN's CPU kernels, after the Edge TPU.
    edgetpu = tmp_path / "usr" / "lib" / "aarch64-linux-gnu" / "libedgetpu.so.1"
    armnn = tmp_path / "usr" / "local" / "lib" / "libarmnnDelegate.so"
    for p in (edgetpu, armnn):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"")
    found = discover_delegates(root=str(tmp_path), find_library=nothing)
    assert [delegate_name(d.library) for d in found] == ["edgetpu", "teflon", "armnn"]
    assert [k[2] for k in KNOWN_DELEGATES] == ["edgetpu", "teflon", "armnn"]


def test_a_teflon_choice_that_cannot_load_is_a_load_error(tmp_path: Path, open_lite: Open) -> None:
    """On this x86 host (or a board without the package) a Teflon choice is refused with the
    reason, not run on XNNPACK behind the selector's back."""
    teflon = tmp_path / "usr" / "lib" / "teflon" / "libteflon.so"
    teflon.parent.mkdir(parents=True)
    teflon.write_bytes(b"not an ELF file")
    with pytest.raises(ModelLoadError, match="libteflon.so cannot be loaded"):
        open_lite(tm.add_model(tmp_path / "add.tflite"), Choice("litert", str(teflon)))
    assert os.path.isfile(teflon)
