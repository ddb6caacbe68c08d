"""The LiteRT backend (``edgeinfer.runtime.tflite``) on the real BlazeFace model and tiny models."""

from __future__ import annotations

import ctypes.util
import gc
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter

import edgeinfer
from edgeinfer.errors import (
    BackendUnavailableError,
    ConfigError,
    ModelFormatError,
    ModelLoadError,
    ModelNotFoundError,
    ProviderFallbackError,
    StateError,
)
from edgeinfer.runtime import open_session as open_any
from edgeinfer.runtime.backends import backend_options
from edgeinfer.runtime.base import DelegateSpec, SessionSpec, check_feeds
from edgeinfer.runtime.backends.delegates import delegate_name, discover_delegates
from edgeinfer.runtime.backends.tflite import (
    TFLiteSession,
    open_session,
    runtime_version,
    tflite_quantization,
)
from edgeinfer.testing import tflite_models as tm

REPO = Path(edgeinfer.__file__).resolve().parents[1]
Open = Callable[..., TFLiteSession]


@pytest.fixture
def open_tflite() -> Any:
    """``open_tflite(path, **spec_fields)``: a session closed at the end of the test."""
    sessions: list[TFLiteSession] = []

    def _open(path: Path, **kw: Any) -> TFLiteSession:
        kw.setdefault("threads", 1)
        if "delegates" in kw:  # LiteRT's own option, carried in SessionSpec.options
            kw["options"] = backend_options(delegates=kw.pop("delegates"))
        spec = SessionSpec(path=Path(path), format="tflite", sha256="0" * 64, **kw)
        session = open_session(spec)
        sessions.append(session)
        return session

    yield _open
    for s in sessions:
        s.close()


def _run(session: TFLiteSession, feeds: Any) -> dict[str, np.ndarray]:
    return session.run(check_feeds(session.inputs, feeds, accept_float_for_quantized=True))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


# --- the real BlazeFace model ------------------------------------------------------------------


def test_blazeface_matches_raw_interpreter(blazeface_path: Path, open_tflite: Open) -> None:
    x = np.random.default_rng(7).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
    raw = Interpreter(model_path=str(blazeface_path), num_threads=2)
    raw.allocate_tensors()
    raw.set_tensor(raw.get_input_details()[0]["index"], x)
    raw.invoke()
    want = {d["name"]: raw.get_tensor(d["index"]) for d in raw.get_output_details()}

    session = open_tflite(blazeface_path, threads=2)
    got = _run(session, x)

    assert [s.name for s in session.inputs] == ["input"]
    assert session.inputs[0].shape == (1, 128, 128, 3) and session.inputs[0].dtype == "float32"
    assert {s.name: s.shape for s in session.outputs} == {
        "regressors": (1, 896, 16),
        "classificators": (1, 896, 1),
    }
    assert set(got) == {"regressors", "classificators"}
    for name in ("regressors", "classificators"):
        assert got[name].shape == want[name].shape and got[name].dtype == np.float32
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)
    assert session.provider == "xnnpack"
    assert session.quantization == "float16"  # BlazeFace ships float16 weights + DEQUANTIZE


def test_report_after_load_and_warmup(blazeface_path: Path, open_tflite: Open) -> None:
    report = open_tflite(blazeface_path).report
    assert report.backend == "tflite" and report.provider == "xnnpack"
    assert report.requested[-1] == "xnnpack" and report.fallbacks == []
    assert report.warmed_up and report.warmup_note == ""
    assert report.load_ms > 0 and report.warmup_ms > 0
    # The interpreter maps the 229 kB model and allocates an arena: resident memory grows.
    assert report.rss_load_mb > 0
    assert report.rss_first_run_mb >= report.rss_load_mb - 1.0


def test_without_warmup(blazeface_path: Path, open_tflite: Open) -> None:
    report = open_tflite(blazeface_path, warmup=False).report
    assert not report.warmed_up and report.warmup_ms == 0.0


def test_num_threads_is_honoured(blazeface_path: Path, open_tflite: Open) -> None:
    # XNNPACK's thread pool holds num_threads - 1 worker threads (the caller is the last one).
    gc.collect()
    before = _threads()
    session = open_tflite(blazeface_path, threads=3)
    assert session.threads == 3
    assert _threads() - before == 2
    session.close()
    gc.collect()
    assert _threads() == before
    assert open_tflite(blazeface_path, threads=1).threads == 1
    assert _threads() == before


def test_registry_resolves_tflite(blazeface_path: Path) -> None:
    spec = SessionSpec(path=blazeface_path, format="tflite", sha256="0" * 64, threads=1)
    session = open_any(spec)
    try:
        assert isinstance(session, TFLiteSession)
    finally:
        session.close()


def test_outputs_are_copies_not_views(blazeface_path: Path, open_tflite: Open) -> None:
    session = open_tflite(blazeface_path)
    first = _run(session, np.zeros((1, 128, 128, 3), np.float32))
    kept = {k: v.copy() for k, v in first.items()}
    _run(session, np.ones((1, 128, 128, 3), np.float32))
    for name, value in first.items():
        np.testing.assert_array_equal(value, kept[name])


def test_close_is_idempotent_and_run_after_close_fails(
    blazeface_path: Path, open_tflite: Open
) -> None:
    session = open_tflite(blazeface_path)
    session.close()
    session.close()
    with pytest.raises(StateError, match="closed"):
        session.run({"input": np.zeros((1, 128, 128, 3), np.float32)})
    assert session.provider == "xnnpack"  # what ran stays readable for logs


# --- tiny float models -------------------------------------------------------------------------


@pytest.mark.arm64
def test_add_model_matches_numpy(tmp_path: Path, open_tflite: Open) -> None:
    session = open_tflite(tm.add_model(tmp_path / "add.tflite"))
    x = np.array([[0.5, -1.0, 2.25, 3.0]], np.float32)
    y = _run(session, x)["y"]
    np.testing.assert_array_equal(y, tm.add_reference(x))
    assert session.quantization == "float"
    assert session.inputs[0].quantization is None


@pytest.mark.arm64
@pytest.mark.parametrize(
    ("builder", "quantization", "atol"),
    [
        (tm.fully_connected_model, "float", 1e-6),
        (tm.float16_fc_model, "float16", 1e-6),  # the weights are exact in float16
        (tm.dynamic_range_fc_model, "int8-dynamic", 0.05),  # inputs quantized on the fly
    ],
)
def test_fully_connected_models_match_numpy(
    tmp_path: Path, open_tflite: Open, builder: Any, quantization: str, atol: float
) -> None:
    session = open_tflite(builder(tmp_path / "fc.tflite"))
    x = np.random.default_rng(1).uniform(-1, 1, (1, 4)).astype(np.float32)
    y = _run(session, x)["y"]
    assert y.dtype == np.float32 and y.shape == (1, 3)
    np.testing.assert_allclose(y, tm.fully_connected_reference(x), atol=atol)
    assert session.quantization == quantization


@pytest.mark.arm64
def test_dynamic_batch_is_resized_per_run(tmp_path: Path, open_tflite: Open) -> None:
    session = open_tflite(tm.add_model(tmp_path / "add.tflite", dynamic_batch=True))
    assert session.inputs[0].shape == (None, 4) and session.outputs[0].shape == (None, 4)
    rng = np.random.default_rng(2)
    for batch in (3, 1, 5, 5):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        np.testing.assert_allclose(_run(session, x)["y"], tm.add_reference(x), rtol=1e-6)


@pytest.mark.arm64
def test_input_shapes_fix_dynamic_dims_at_load(tmp_path: Path, open_tflite: Open) -> None:
    path = tm.reshape_model(tmp_path / "reshape.tflite")
    session = open_tflite(path, input_shapes={"x": (2, 4)})
    assert session.report.warmed_up and session.report.warmup_note == ""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(_run(session, x)["y"], x.reshape(8))
    with pytest.raises(ConfigError, match="does not fit"):
        open_tflite(path, input_shapes={"x": (2, 5)})
    with pytest.raises(ConfigError, match="the model's inputs are"):
        open_tflite(path, input_shapes={"nope": (2, 4)})


@pytest.mark.arm64
def test_warmup_failing_on_guessed_shapes_is_a_note(
    tmp_path: Path, open_tflite: Open, caplog: pytest.LogCaptureFixture
) -> None:
    path = tm.reshape_model(tmp_path / "reshape.tflite")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.tflite"):
        session = open_tflite(path)
    assert not session.report.warmed_up
    assert "guessed" in session.report.warmup_note and "input_shapes" in session.report.warmup_note
    assert any("guessed" in r.getMessage() for r in caplog.records)
    # The failed resize left the session usable for the shape that fits.
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(_run(session, x)["y"], x.reshape(8))


@pytest.mark.arm64
def test_warmup_failing_on_given_shapes_is_an_error(tmp_path: Path, open_tflite: Open) -> None:
    with pytest.raises(ModelLoadError):
        open_tflite(tm.reshape_model(tmp_path / "reshape.tflite"), input_shapes={"x": (3, 4)})


# --- quantized models --------------------------------------------------------------------------


@pytest.mark.arm64
def test_int8_float_in_float_out_within_one_step(tmp_path: Path, open_tflite: Open) -> None:
    session = open_tflite(tm.int8_fc_model(tmp_path / "int8.tflite"))
    spec = session.inputs[0]
    assert spec.dtype == "int8"
    assert spec.quantization == pytest.approx(tm.INT8_FC_INPUT)
    assert session.outputs[0].quantization == pytest.approx(tm.INT8_FC_OUTPUT)
    assert session.quantization == "int8"
    step = tm.INT8_FC_OUTPUT[0]
    for x in np.random.default_rng(3).uniform(-1, 1, (20, 1, 4)).astype(np.float32):
        y = _run(session, x)["y"]
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, tm.fully_connected_reference(x), atol=step)


@pytest.mark.arm64
def test_int8_input_passes_through(tmp_path: Path, open_tflite: Open) -> None:
    path = tm.int8_fc_model(tmp_path / "int8.tflite")
    x_q = np.array([[-100, 0, 57, 127]], np.int8)
    want = tm.int8_fc_reference(x_q)
    step = tm.INT8_FC_OUTPUT[0]
    y = _run(open_tflite(path), x_q)["y"]
    np.testing.assert_allclose(y, want, atol=step)
    raw = _run(open_tflite(path, dequantize_outputs=False), x_q)["y"]
    assert raw.dtype == np.int8
    want_q = tm.quantize(want, *tm.INT8_FC_OUTPUT)
    assert np.abs(raw.astype(int) - want_q.astype(int)).max() <= 1
    np.testing.assert_allclose(tm.dequantize(raw, *tm.INT8_FC_OUTPUT), y)


@pytest.mark.arm64
def test_uint8_float_input_is_quantized_and_clipped(tmp_path: Path, open_tflite: Open) -> None:
    session = open_tflite(tm.uint8_add_model(tmp_path / "u8.tflite"))
    step = tm.UINT8_ADD_OUT[0]
    x = np.array([[-0.5, 0.0, 0.7, 1.2]], np.float32)
    want = tm.uint8_add_reference(tm.quantize(x, *tm.UINT8_ADD_IN, np.uint8))
    np.testing.assert_allclose(_run(session, x)["y"], want, atol=step)
    # Out of range: clipped to 0 and 255 like the reference, not wrapped around.
    x = np.array([[-100.0, 100.0, -3.0, 3.0]], np.float32)
    x_q = tm.quantize(x, *tm.UINT8_ADD_IN, np.uint8)
    assert x_q.tolist() == [[0, 255, 0, 255]]
    np.testing.assert_allclose(_run(session, x)["y"], tm.uint8_add_reference(x_q), atol=step)
    # The tensor's own dtype goes in unchanged.
    np.testing.assert_allclose(_run(session, x_q)["y"], tm.uint8_add_reference(x_q), atol=step)


@pytest.mark.arm64
def test_quantization_from_details() -> None:
    def t(index: int, dtype: Any, scale: float = 0.0) -> dict[str, Any]:
        scales = np.array([scale] if scale else [], np.float32)
        return {
            "index": index,
            "dtype": dtype,
            "quantization": (scale, 0),
            "quantization_parameters": {"scales": scales},
        }

    x, w, y = t(0, np.float32), t(1, np.int8, 0.1), t(2, np.float32)
    assert tflite_quantization([x, w, y], [x], [y], ops=[{"outputs": [2]}]) == "int8-dynamic"
    # int8 activations inside a float-I/O model (QUANTIZE ... DEQUANTIZE) are full int8.
    a = t(3, np.int8, 0.05)
    ops = [{"outputs": [3]}, {"outputs": [2]}]
    assert tflite_quantization([x, w, a, y], [x], [y], ops=ops) == "int8"
    assert tflite_quantization([x, t(4, np.int32, 0.01), y], [x], [y]) == "int8"
    assert tflite_quantization([x, t(5, np.float16), y], [x], [y]) == "float16"
    assert tflite_quantization([x, y], [x], [y]) == "float"


# --- delegates ---------------------------------------------------------------------------------


@pytest.mark.arm64
def test_missing_delegate_is_a_recorded_fallback(
    tmp_path: Path, open_tflite: Open, caplog: pytest.LogCaptureFixture, monkeypatch: Any
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    path = tm.add_model(tmp_path / "add.tflite")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.runtime.tflite"):
        session = open_tflite(path, delegates=(DelegateSpec("/nonexistent/libfoo.so"),))
    assert session.provider == "xnnpack" and session.report.provider == "xnnpack"
    assert session.report.requested == ("foo", "xnnpack")
    [fallback] = session.report.fallbacks
    assert fallback.provider == "/nonexistent/libfoo.so"
    assert "No such file" in fallback.reason or "cannot open" in fallback.reason
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "/nonexistent/libfoo.so" in caplog.records[0].getMessage()
    x = np.zeros((1, 4), np.float32)
    np.testing.assert_array_equal(_run(session, x)["y"], tm.add_reference(x))
    gc.collect()
    assert unraisable == []  # no "Exception ignored in Delegate.__del__" noise


@pytest.mark.arm64
def test_library_that_is_not_a_delegate_falls_back(tmp_path: Path, open_tflite: Open) -> None:
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand for a non-delegate library")
    session = open_tflite(
        tm.add_model(tmp_path / "add.tflite"),
        delegates=(DelegateSpec("/nonexistent/libfoo.so"), DelegateSpec(libm)),
    )
    assert [f.provider for f in session.report.fallbacks] == ["/nonexistent/libfoo.so", libm]
    assert "not a TFLite external delegate" in session.report.fallbacks[1].reason
    assert session.provider == "xnnpack"


@pytest.mark.arm64
def test_strict_providers_turns_fallback_into_error(tmp_path: Path, open_tflite: Open) -> None:
    with pytest.raises(ProviderFallbackError, match="/nonexistent/libfoo.so"):
        open_tflite(
            tm.add_model(tmp_path / "add.tflite"),
            delegates=(DelegateSpec("/nonexistent/libfoo.so"),),
            strict_providers=True,
        )


@pytest.mark.arm64
def test_no_discovery_unless_auto(tmp_path: Path, open_tflite: Open) -> None:
    session = open_tflite(tm.add_model(tmp_path / "add.tflite"), providers=("cpu",))
    assert session.report.requested == ("xnnpack",) and session.report.fallbacks == []


@pytest.mark.arm64
def test_discover_delegates_in_given_dirs(tmp_path: Path) -> None:
    usr, local = tmp_path / "usr", tmp_path / "local"
    usr.mkdir()
    local.mkdir()
    (local / "libedgetpu.so.1").write_bytes(b"")
    (usr / "libarmnnDelegate.so").write_bytes(b"")
    (local / "libarmnnDelegate.so").write_bytes(b"")
    asked: list[str] = []

    def nothing(name: str) -> str | None:
        asked.append(name)
        return None

    found = discover_delegates([str(usr), str(local)], find_library=nothing)
    assert found == (
        DelegateSpec(str(local / "libedgetpu.so.1"), {}),
        DelegateSpec(str(usr / "libarmnnDelegate.so"), {"backends": "CpuAcc,CpuRef"}),
    )
    assert asked == []
    assert discover_delegates([str(tmp_path / "empty")], find_library=nothing) == ()
    assert asked == ["edgetpu", "armnnDelegate"]
    by_name = discover_delegates(
        [], find_library=lambda n: "libedgetpu.so.1" if n == "edgetpu" else None
    )
    assert by_name == (DelegateSpec("libedgetpu.so.1", {}),)


@pytest.mark.arm64
@pytest.mark.parametrize(
    ("library", "name"),
    [
        ("/usr/lib/aarch64-linux-gnu/libedgetpu.so.1", "edgetpu"),
        ("libedgetpu.so.1.0", "edgetpu"),
        ("/usr/local/lib/libarmnnDelegate.so", "armnn"),
        ("/opt/vx/libvx_delegate.so", "vx"),
        ("/nonexistent/libfoo.so", "foo"),
    ],
)
def test_delegate_name(library: str, name: str) -> None:
    assert delegate_name(library) == name


# --- bad files ---------------------------------------------------------------------------------


@pytest.mark.arm64
def test_header_errors(tmp_path: Path, open_tflite: Open) -> None:
    with pytest.raises(ModelNotFoundError):
        open_tflite(tmp_path / "missing.tflite")
    (tmp_path / "text.tflite").write_text("definitely not a model\n")
    with pytest.raises(ModelFormatError, match="TFL3"):
        open_tflite(tmp_path / "text.tflite")
    (tmp_path / "short.tflite").write_bytes(b"\xff\xff\x00\x00TFL3" + b"\x00" * 8)
    with pytest.raises(ModelFormatError, match="truncated or corrupt"):
        open_tflite(tmp_path / "short.tflite")


_CHILD = """
import json, sys
from pathlib import Path
from edgeinfer.errors import EdgeInferError
from edgeinfer.runtime.base import SessionSpec
from edgeinfer.runtime.backends.tflite import open_session
for path in sys.argv[1:]:
    spec = SessionSpec(path=Path(path), format="tflite", sha256="0" * 64, threads=1)
    try:
        open_session(spec).close()
        result = "loaded"
    except EdgeInferError as exc:
        result = type(exc).__name__ + ": " + str(exc)
    print(json.dumps([path, result]), flush=True)
"""


def _load_in_child(paths: list[Path]) -> dict[str, str]:
    """Open each file in one subprocess so that a crash fails the test instead of pytest."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    results = dict(json.loads(line) for line in proc.stdout.splitlines() if line.startswith("["))
    assert proc.returncode == 0, (
        f"child died with {proc.returncode} after {len(results)} of {len(paths)} files: "
        f"{proc.stderr[-2000:]}"
    )
    return results


def _assert_refused(results: dict[str, str]) -> None:
    for path, result in results.items():
        assert result.startswith(("ModelFormatError: ", "ModelLoadError: ")), (path, result)


def test_truncated_and_random_files_are_refused(blazeface_path: Path, tmp_path: Path) -> None:
    data = blazeface_path.read_bytes()
    rng = np.random.default_rng(11)
    files: list[Path] = []
    for frac in (0.02, 0.25, 0.5, 0.9, 0.999):
        files.append(tmp_path / f"trunc-{frac}.tflite")
        files[-1].write_bytes(data[: int(len(data) * frac)])
    for i in range(3):
        noise = bytearray(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
        noise[0:8] = (16).to_bytes(4, "little") + b"TFL3"
        files.append(tmp_path / f"random-{i}.tflite")
        files[-1].write_bytes(bytes(noise))
    results = _load_in_child(files)
    assert len(results) == len(files)
    _assert_refused(results)
    assert all("ModelFormatError" in r for r in results.values())


@pytest.mark.arm64
def test_corrupt_tiny_models_are_refused(tmp_path: Path) -> None:
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    base = tm.add_model_bytes()

    def mutate(fn: Callable[[Any], None]) -> bytes:
        model = schema.ModelT.InitFromPackedBuf(base, 0)
        fn(model)
        b = flatbuffers.Builder(1024)
        b.Finish(model.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def sg(m: Any) -> Any:
        return m.subgraphs[0]

    cases: dict[str, Callable[[Any], None]] = {
        "op-input-out-of-range": lambda m: setattr(sg(m).operators[0], "inputs", [0, 99]),
        "opcode-out-of-range": lambda m: setattr(sg(m).operators[0], "opcodeIndex", 5),
        "buffer-out-of-range": lambda m: setattr(sg(m).tensors[1], "buffer", 42),
        "constant-too-short": lambda m: setattr(m.buffers[1], "data", np.zeros(3, np.uint8)),
        "negative-dim": lambda m: setattr(sg(m).tensors[0], "shape", [1, -7]),
        "no-subgraph": lambda m: setattr(m, "subgraphs", []),
        "unknown-type": lambda m: setattr(sg(m).tensors[0], "type", 99),
        "unknown-op": lambda m: setattr(m.operatorCodes[0], "builtinCode", 9999),
    }
    files = []
    for name, fn in cases.items():
        files.append(tmp_path / f"{name}.tflite")
        files[-1].write_bytes(mutate(fn))
    rng = np.random.default_rng(5)
    for i in range(12):
        flipped = bytearray(base)
        for j in rng.integers(0, len(base), 3):
            flipped[j] = int(rng.integers(0, 256))
        files.append(tmp_path / f"flipped-{i}.tflite")
        files[-1].write_bytes(bytes(flipped))
    results = _load_in_child(files)
    assert len(results) == len(files)
    for name in cases:
        result = results[str(tmp_path / f"{name}.tflite")]
        assert result.startswith(("ModelFormatError: ", "ModelLoadError: ")), (name, result)
    # A few flipped bytes may land in data (the constant) and still load; never a crash.
    for path, result in results.items():
        assert result == "loaded" or result.startswith(("ModelFormatError", "ModelLoadError")), (
            path,
            result,
        )


# --- runtime import ----------------------------------------------------------------------------


@pytest.mark.arm64
def test_runtime_version() -> None:
    import ai_edge_litert

    assert runtime_version() == ("ai_edge_litert", ai_edge_litert.__version__)


@pytest.mark.arm64
def test_no_runtime_installed(monkeypatch: Any, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", None)
    with pytest.raises(BackendUnavailableError, match="pip install ai-edge-litert"):
        runtime_version()


@pytest.mark.arm64
def test_falls_back_to_tflite_runtime(monkeypatch: Any, tmp_path: Path, open_tflite: Open) -> None:
    # The same interpreter module under the legacy package's name, with LiteRT hidden.
    import types

    from ai_edge_litert import interpreter

    legacy = types.ModuleType("tflite_runtime")
    legacy.interpreter = interpreter  # type: ignore[attr-defined]
    legacy.__version__ = "2.14.0"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ai_edge_litert", None)
    monkeypatch.setitem(sys.modules, "tflite_runtime", legacy)
    monkeypatch.setitem(sys.modules, "tflite_runtime.interpreter", interpreter)
    assert runtime_version() == ("tflite_runtime", "2.14.0")
    session = open_tflite(tm.add_model(tmp_path / "add.tflite"))
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(_run(session, x)["y"], tm.add_reference(x))
