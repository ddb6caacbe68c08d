"""The backends ``providers: auto`` measures, on the aarch64 roots of ``scripts/test-arm64.sh``.

Each root's venv has onnxruntime, LiteRT and OpenVINO from their aarch64 wheels (trixie adds
Debian's ARM NN, tested in ``tests/runtime/test_armnn.py``). The script names them in
``EDGEINFER_EXPECT_BACKENDS``: a backend named there that does not import fails here instead
of skipping. On a host the tests run where the backend is installed and skip where it is not.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeinfer.runtime.base import Choice, SessionSpec, check_feeds

pytestmark = pytest.mark.arm64

_MODULES = {"onnxruntime": "edgeinfer.runtime.backends.onnx",
            "litert": "edgeinfer.runtime.backends.tflite",
            "openvino": "edgeinfer.runtime.backends.openvino",
            "armnn": "edgeinfer.runtime.backends.armnn"}


def _expected() -> list[str]:
    return os.environ.get("EDGEINFER_EXPECT_BACKENDS", "").split()


def _backend(name: str) -> Any:
    """The backend module, or a skip saying why (a failure where the script expects it)."""
    try:
        module = importlib.import_module(_MODULES[name])
    except ImportError as exc:  # runtime/openvino.py or armnn.py not in this tree
        pytest.skip(f"{_MODULES[name]} is not in this tree: {exc}")
    available = getattr(module, "available", None)
    if available is not None and not available():
        if name in _expected():
            pytest.fail(f"EDGEINFER_EXPECT_BACKENDS names {name} but it does not import here")
        pytest.skip(f"{name} is not installed here")
    return module


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))


def _open(module: Any, path: Path, choice: Choice | None, **kw: Any) -> Any:
    kw.setdefault("threads", 2)
    fmt = "onnx" if path.suffix == ".onnx" else "tflite"
    return module.open_session(SessionSpec(path=path, format=fmt, sha256="0" * 64,
                                           choice=choice, **kw))


def _run(session: Any, feeds: Any) -> dict[str, np.ndarray]:
    return dict(session.run(check_feeds(session.inputs, feeds, accept_float_for_quantized=True)))


def test_every_expected_backend_imports_with_a_version() -> None:
    names = _expected()
    if not names:
        pytest.skip("EDGEINFER_EXPECT_BACKENDS is set by scripts/test-arm64.sh only")
    versions = {}
    for name in names:
        module = _backend(name)
        if name == "onnxruntime":
            versions[name] = module.import_ort().__version__
        elif name == "litert":
            versions[name] = module.runtime_version()[1]
        else:
            versions[name] = module.version()
    assert all(v and v != "unknown" for v in versions.values()), versions


@pytest.mark.parametrize("backend", ["litert", "openvino", "armnn"])
def test_blazeface_in_every_precision_offered(backend: str, blazeface_path: Path) -> None:
    module = _backend(backend)
    litert = _backend("litert")
    device = {"litert": "xnnpack", "openvino": "CPU", "armnn": "CpuAcc"}[backend]
    offered = module.precisions()
    assert "fp32" in offered
    ref = _open(litert, blazeface_path, None, threads=1)
    x = np.random.default_rng(11).uniform(-1, 1, (1, 128, 128, 3)).astype(np.float32)
    want = _run(ref, x)
    ref.close()
    for precision in offered:
        session = _open(module, blazeface_path, Choice(backend, device, precision, 2))
        assert session.report.choice == Choice(backend, device, precision, 2)
        assert [s.name for s in session.outputs] == list(want)
        got = _run(session, x)
        session.close()
        for name, value in want.items():
            assert got[name].shape == value.shape and got[name].dtype == np.float32
            if precision == "fp32":
                np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-3)
            else:
                assert _cosine(got[name], value) > 0.999, (precision, name)


def test_openvino_runs_yolo_like_onnxruntime(yolo_path: Path) -> None:
    openvino = _backend("openvino")
    ort = _backend("onnxruntime").import_ort()
    shapes = {"images": (1, 3, 320, 320)}
    session = _open(openvino, yolo_path, Choice("openvino", "CPU", "fp32", 2),
                    input_shapes=shapes, warmup=False)
    x = np.random.default_rng(2).uniform(0, 1, shapes["images"]).astype(np.float32)
    got = _run(session, {"images": x})
    session.close()
    raw = ort.InferenceSession(str(yolo_path), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in raw.get_outputs()], raw.run(None, {"images": x})))
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].shape == value.shape
        # Box coordinates in pixels (0-320) and class scores (0-1), summed in another order.
        np.testing.assert_allclose(got[name], value, rtol=1e-3, atol=2e-2)
