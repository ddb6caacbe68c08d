"""Fixtures of the OTA daemon tests: the models pushed, and the rig (``rig.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeinfer.testing import onnx_models
from rig import Rig


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("ota-models")
    v1 = onnx_models.tiny_classifier(d / "classifier.onnx")
    v2 = onnx_models.quantized_classifier(v1, d / "classifier-int8.onnx")
    corrupt = d / "classifier-int8-corrupt.onnx"
    data = bytearray(v2.read_bytes())
    for i in range(len(data) // 3, len(data) // 3 + 64):
        data[i] ^= 0x5A
    corrupt.write_bytes(bytes(data))
    return {
        "v1": v1, "v2": v2, "corrupt": corrupt,
        "v3": onnx_models.tiny_classifier(d / "classifier-v3.onnx", seed=3),
        "wrong_task": onnx_models.spatial_output_model(d / "features.onnx"),
        "hog": onnx_models.memory_hog_model(d / "hog.onnx"),
        "not_onnx": _write(d / "notes.onnx", b"these are not the weights you are looking for\n"),
    }


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture
def rig(mqtt_broker: tuple[str, int], tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, *mqtt_broker)
    try:
        yield r
    finally:
        r.close()


