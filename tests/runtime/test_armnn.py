"""The ARM NN backend (``edgeinfer.runtime.armnn``) against LiteRT on the same files.

pyarmnn exists only as Debian's arm64 package: these tests run in the trixie root of
``scripts/test-arm64.sh`` (which sets ``EDGEINFER_EXPECT_BACKENDS`` so that a missing pyarmnn
fails there instead of skipping) and skip elsewhere with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.errors import ConfigError, ModelError, ModelLoadError, StateError
from edgeinfer.runtime.backends import armnn
from edgeinfer.runtime.backends import tflite as litert
from edgeinfer.runtime.base import Choice, SessionSpec, check_feeds
from edgeinfer.testing import tflite_models as tm

pytestmark = pytest.mark.arm64


def _require_armnn() -> None:
    if armnn.available():
        return
    expected = os.environ.get("EDGEINFER_EXPECT_BACKENDS", "").split()
    if "armnn" in expected:
        pytest.fail("EDGEINFER_EXPECT_BACKENDS names armnn but pyarmnn does not import")
    pytest.skip("pyarmnn is not installed: Debian's arm64 packages (python3-pyarmnn); "
                "run scripts/test-arm64.sh --suite trixie")


@pytest.fixture
def needs_armnn() -> None:
    _require_armnn()


Opener = Callable[..., Any]


def _spec(path: Path, **kw: Any) -> SessionSpec:
    kw.setdefault("threads", 2)
    kw.setdefault("format", "tflite")
    return SessionSpec(path=Path(path), sha256="0" * 64, **kw)


@pytest.fixture
def open_both() -> Iterator[Opener]:
    """``open_both(module, path, **spec_fields)``: a session closed at the end of the test."""
    sessions: list[Any] = []

    def _open(module: Any, path: Path, **kw: Any) -> Any:
        session = module.open_session(_spec(path, **kw))
        sessions.append(session)
        return session

    yield _open
    for s in sessions:
        s.close()


def _run(session: Any, feeds: Any) -> dict[str, np.ndarray]:
    return dict(session.run(check_feeds(session.inputs, feeds, accept_float_for_quantized=True)))


@pytest.mark.usefixtures("needs_armnn")
def test_blazeface_matches_litert(blazeface_path: Path, open_both: Opener) -> None:
    ours = open_both(armnn, blazeface_path)
    ref = open_both(litert, blazeface_path, threads=1)
    # The tasks look tensors up by name: the same names, shapes and dtypes as LiteRT's.
    assert [(s.name, s.shape, s.dtype) for s in ours.inputs] == \
        [(s.name, s.shape, s.dtype) for s in ref.inputs]
    assert [(s.name, s.shape, s.dtype) for s in ours.outputs] == \
        [(s.name, s.shape, s.dtype) for s in ref.outputs]
    assert ours.provider == "armnn-CpuAcc" and ours.report.backend == "armnn"
    assert ours.report.choice == Choice("armnn", "CpuAcc", "fp32", 2)
    assert ours.report.warmed_up and ours.report.load_ms > 0
    for seed in range(3):
        x = np.random.default_rng(seed).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
        got, want = _run(ours, x), _run(ref, x)
        assert set(got) == {"regressors", "classificators"}
        for name, value in want.items():
            assert got[name].dtype == np.float32
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-3)


@pytest.mark.usefixtures("needs_armnn")
def test_outputs_are_copies_and_inputs_stay_writeable(blazeface_path: Path,
                                                      open_both: Opener) -> None:
    session = open_both(armnn, blazeface_path)
    x = np.zeros((1, 128, 128, 3), np.float32)
    first = _run(session, x)
    kept = {k: v.copy() for k, v in first.items()}
    x[:] = 0.5  # pyarmnn marks the array it wraps read-only: it must not be the caller's
    _run(session, x)
    for name, value in first.items():
        np.testing.assert_array_equal(value, kept[name])


@pytest.mark.usefixtures("needs_armnn")
def test_fp16_where_the_cpu_does_fp16_arithmetic(blazeface_path: Path, open_both: Opener) -> None:
    features = next((line.split(":", 1)[1].split() for line in
                     Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("Features")), [])
    offered = armnn.precisions()
    assert offered == (("fp32", "fp16") if "asimdhp" in features else ("fp32",))
    if "fp16" not in offered:  # a Pi 4's Cortex-A72: asked anyway, refused with the reason
        with pytest.raises(ModelLoadError, match="fp16"):
            open_both(armnn, blazeface_path, choice=Choice("armnn", "CpuAcc", "fp16", 2))
        return
    half = open_both(armnn, blazeface_path, choice=Choice("armnn", "CpuAcc", "fp16", 2))
    full = open_both(armnn, blazeface_path)
    x = np.random.default_rng(1).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
    got, want = _run(half, x), _run(full, x)
    for name, value in want.items():
        a, b = got[name].ravel().astype(np.float64), value.ravel().astype(np.float64)
        assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999
        # Reduced for real: fp16 arithmetic does not give fp32's bits.
        assert not np.array_equal(got[name], value)


@pytest.mark.usefixtures("needs_armnn")
def test_threads_reach_the_compute_library(blazeface_path: Path) -> None:
    # The Arm Compute Library keeps one process-wide pool of threads - 1 workers. In a child:
    # a 1-thread session, a 4-thread one loaded after it, then the first run again.
    code = textwrap.dedent("""
        import json, os, sys, time
        import numpy as np
        from pathlib import Path
        from edgeinfer.runtime.backends import armnn
        from edgeinfer.runtime.base import SessionSpec

        def tasks(want=None):
            # Finished workers leave the task list a moment after the pool shrinks.
            for _ in range(100):
                n = len(os.listdir("/proc/self/task"))
                if want is None or n == want:
                    return n
                time.sleep(0.05)
            return n

        def open_(threads):
            return armnn.open_session(SessionSpec(path=Path(sys.argv[1]), format="tflite",
                                                  sha256="0" * 64, threads=threads))
        x = {"input": np.zeros((1, 128, 128, 3), np.float32)}
        one = open_(1)
        one.run(x)
        n1 = tasks()
        four = open_(4)
        four.run(x)
        n4 = tasks()
        one.run(x)
        again = tasks(n1)
        print(json.dumps({"one": n1, "four": n4, "again": again,
                          "threads": [one.threads, four.threads]}))
    """)
    r = subprocess.run([sys.executable, "-c", code, str(blazeface_path)], capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    assert counts["threads"] == [1, 4]
    assert counts["four"] - counts["one"] >= 3, counts
    assert counts["again"] == counts["one"], counts  # set back before the 1-thread run


@pytest.mark.usefixtures("needs_armnn")
def test_import_prints_nothing_on_stdout() -> None:
    # pyarmnn prints a deprecation notice at import; a --json command's stdout must stay JSON.
    code = "from edgeinfer.runtime.backends import armnn; print(armnn.available(), armnn.version())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", armnn.version()]
    assert armnn.version().split(".")[0].isdigit()


@pytest.mark.usefixtures("needs_armnn")
def test_quantized_models_take_and_give_float_like_litert(tmp_path: Path,
                                                          open_both: Opener) -> None:
    for path, step in ((tm.int8_fc_model(tmp_path / "int8.tflite"), tm.INT8_FC_OUTPUT[0]),
                       (tm.uint8_add_model(tmp_path / "u8.tflite"), tm.UINT8_ADD_OUT[0])):
        ours = open_both(armnn, path, threads=1)
        ref = open_both(litert, path, threads=1)
        assert [(s.name, s.dtype) for s in ours.inputs] == [(s.name, s.dtype) for s in ref.inputs]
        assert ours.inputs[0].quantization == pytest.approx(ref.inputs[0].quantization)
        assert ours.outputs[0].quantization == pytest.approx(ref.outputs[0].quantization)
        assert ours.quantization == "int8"
        x = np.random.default_rng(5).uniform(-1.5, 1.5, (1, 4)).astype(np.float32)
        got, want = _run(ours, x)["y"], _run(ref, x)["y"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=step * 1.01)
        raw = open_both(armnn, path, threads=1, dequantize_outputs=False)
        assert _run(raw, x)["y"].dtype == np.dtype(ref.outputs[0].dtype)


@pytest.mark.usefixtures("needs_armnn")
def test_refusals_name_the_reason(tmp_path: Path, silero_path: Path, open_both: Opener) -> None:
    with pytest.raises(ModelLoadError, match="ONNX parser"):
        open_both(armnn, silero_path, format="onnx")
    model = tm.add_model(tmp_path / "add.tflite")
    missing = next(d for d in ("CpuRef", "GpuAcc") if d not in armnn.devices())
    with pytest.raises(ModelLoadError, match=f"no {missing} backend"):
        open_both(armnn, model, choice=Choice("armnn", missing, "fp32", 1))
    with pytest.raises(ModelLoadError, match="given a litert choice"):
        open_both(armnn, model, choice=Choice("litert", "xnnpack", "fp32", 1))
    with pytest.raises(ConfigError, match="'nope'"):
        open_both(armnn, model, input_shapes={"nope": (1, 4)})
    with pytest.raises(ModelLoadError, match="shapes the file declares"):
        open_both(armnn, model, input_shapes={"x": (2, 4)})
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x18\x00\x00\x00TFL3" + bytes(100))
    with pytest.raises(ModelError):
        open_both(armnn, bad)


@pytest.mark.usefixtures("needs_armnn")
def test_closed_session_refuses_to_run(tmp_path: Path) -> None:
    session = armnn.open_session(_spec(tm.add_model(tmp_path / "add.tflite"), threads=1))
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    np.testing.assert_allclose(_run(session, x)["y"], tm.add_reference(x))
    session.close()
    session.close()
    with pytest.raises(StateError):
        _run(session, x)


def test_without_pyarmnn_it_says_how_to_install(blazeface_path: Path) -> None:
    # Runs everywhere: in a child whose import of pyarmnn fails, as on a host without it.
    code = textwrap.dedent("""
        import sys
        from pathlib import Path
        sys.modules["pyarmnn"] = None  # an import of it now raises ImportError
        from edgeinfer.errors import BackendUnavailableError
        from edgeinfer.runtime.backends import armnn
        from edgeinfer.runtime.base import SessionSpec
        assert not armnn.available()
        for call in (armnn.version, lambda: armnn.open_session(SessionSpec(
                path=Path(sys.argv[1]), format="tflite", sha256="0" * 64, threads=1))):
            try:
                call()
            except BackendUnavailableError as exc:
                print(exc)
    """)
    r = subprocess.run([sys.executable, "-c", code, str(blazeface_path)], capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all("apt install python3-pyarmnn" in line for line in lines)
