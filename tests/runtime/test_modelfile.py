"""Model-file inspection: format from bytes, quantization style, corrupt and unsafe files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgeinfer.errors import (
    ModelFormatError,
    ModelNotFoundError,
    ModelTooLargeError,
    UnsafeModelError,
)
from edgeinfer.runtime.modelfile import detect_format, file_sha256, inspect_model
from edgeinfer.testing import onnx_models as om


@pytest.mark.arm64
@pytest.mark.parametrize(
    ("builder", "expected"),
    [
        (om.matmul_model, "float"),
        (om.qdq_matmul_model, "int8-qdq"),
        (om.qoperator_matmul_model, "int8-qoperator"),
        (om.dynamic_int8_model, "int8-dynamic"),
        (om.float16_model, "float16"),
    ],
)
def test_quantization_style_is_read_from_the_graph(tmp_path: Path, builder, expected) -> None:
    info = inspect_model(builder(tmp_path / "m.onnx"))
    assert info.format == "onnx"
    assert info.onnx is not None and info.onnx.quantization == expected
    assert info.onnx.opsets == {"ai.onnx": 17}


def test_qdq_activation_and_weight_types(tmp_path: Path) -> None:
    s8 = inspect_model(om.qdq_matmul_model(tmp_path / "s8.onnx", signed_activations=True)).onnx
    u8 = inspect_model(om.qdq_matmul_model(tmp_path / "u8.onnx", signed_activations=False)).onnx
    assert (s8.activation_type, s8.weight_type) == ("int8", "int8")
    assert (u8.activation_type, u8.weight_type) == ("uint8", "int8")


def test_format_comes_from_bytes_not_the_name(tmp_path: Path, blazeface_path: Path) -> None:
    onnx_named_tflite = tmp_path / "model.tflite"
    om.add_model(onnx_named_tflite)
    assert inspect_model(onnx_named_tflite).format == "onnx"
    tflite_named_onnx = tmp_path / "model.onnx"
    shutil.copy(blazeface_path, tflite_named_onnx)
    info = inspect_model(tflite_named_onnx)
    assert info.format == "tflite" and info.onnx is None
    assert info.sha256 == file_sha256(blazeface_path)


def test_real_models_are_described(yolo_path: Path, silero_path: Path) -> None:
    yolo = inspect_model(yolo_path).onnx
    assert yolo.inputs == {"images": ("batch", 3, "height", "width")}
    assert yolo.quantization == "float" and sum(yolo.op_counts.values()) > 100
    silero = inspect_model(silero_path).onnx
    assert set(silero.inputs) == {"input", "state", "sr"}
    assert silero.op_counts["If"] >= 1  # subgraph nodes are walked too


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (b"", "empty"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n", "Git LFS pointer"),
        (b"PK\x03\x04" + bytes(60), "zip archive"),
        (b"<!DOCTYPE html><html>", "failed download"),
        (b"root:x:0:0:root:/root:/bin/bash\n", "text file"),
        (bytes([0xFF, 0xFE, 0x00, 0x01]) * 16, "unrecognised header"),
    ],
)
def test_files_that_are_no_model_say_what_they_are(tmp_path: Path, data: bytes, phrase: str) -> None:
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    with pytest.raises(ModelFormatError, match=phrase):
        inspect_model(p)


def test_truncated_onnx_is_a_format_error(tmp_path: Path, yolo_path: Path) -> None:
    data = yolo_path.read_bytes()
    for cut in (64, len(data) // 3, len(data) - 7):
        p = tmp_path / f"cut{cut}.onnx"
        p.write_bytes(data[:cut])
        with pytest.raises(ModelFormatError, match="truncated or corrupt"):
            inspect_model(p)


def test_subgraphs_nested_thousands_deep_are_a_format_error(tmp_path: Path) -> None:
    path = om.nested_if_model(tmp_path / "nested.onnx", depth=2000)
    with pytest.raises(ModelFormatError, match="nested deeper than 64 levels"):
        inspect_model(path)  # was RecursionError: an internal error for edgeinfer info/run
    assert inspect_model(om.nested_if_model(tmp_path / "shallow.onnx", depth=3)).format == "onnx"


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        inspect_model(tmp_path / "absent.onnx")
    with pytest.raises(ModelNotFoundError, match="not a file"):
        inspect_model(tmp_path)


def test_size_limit_counts_external_data(tmp_path: Path) -> None:
    p = om.external_data_model(tmp_path / "ext.onnx", k=512, n=512)  # 1 MiB of weights outside
    assert p.stat().st_size < 10_000
    info = inspect_model(p)
    assert info.size_bytes > 1_000_000 and info.onnx.external_data == {"ext.onnx.data"}
    with pytest.raises(ModelTooLargeError, match="over max_model_mb=0.5"):
        inspect_model(p, max_model_mb=0.5)


def test_external_data_outside_the_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    p = om.external_data_model(tmp_path / "sub" / "m.onnx", location="../m.onnx.data")
    with pytest.raises(UnsafeModelError, match="outside the model's folder"):
        inspect_model(p)
    p2 = om.external_data_model(tmp_path / "abs.onnx", location="/etc/passwd")
    with pytest.raises(UnsafeModelError):
        inspect_model(p2)


def test_external_data_symlink_escape_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    p = om.external_data_model(tmp_path / "model" / "m.onnx")
    data = tmp_path / "model" / "m.onnx.data"
    outside = tmp_path / "secret.bin"
    data.rename(outside)
    data.symlink_to(outside)
    with pytest.raises(UnsafeModelError):
        inspect_model(p)


def test_missing_external_data_is_named(tmp_path: Path) -> None:
    p = om.external_data_model(tmp_path / "m.onnx")
    (tmp_path / "m.onnx.data").unlink()
    with pytest.raises(ModelFormatError, match="m.onnx.data"):
        inspect_model(p)


def test_detect_format_heads() -> None:
    assert detect_format(b"\x1c\x00\x00\x00TFL3\x00\x00") == "tflite"
    assert detect_format(b"\x08\x08\x12\x07pytorch") == "onnx"


def test_a_file_version_is_hashed_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib
    import os

    from edgeinfer.runtime import digest

    digest.forget()
    path = om.matmul_model(tmp_path / "m.onnx", k=64, n=64)
    calls = []
    real = hashlib.sha256

    def counting(*args: object) -> object:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(hashlib, "sha256", counting)
    first = inspect_model(path).sha256  # written a moment ago: timestamps may not tell a rewrite
    assert inspect_model(path).sha256 == first and len(calls) == 2
    monkeypatch.setattr(digest, "RACY_NS", 0)  # as if written long ago
    assert inspect_model(path).sha256 == first and len(calls) == 3
    assert inspect_model(path).sha256 == first and len(calls) == 3  # remembered: no hashing
    # written in place, same size, mtime set back: ctime still moves, so it is hashed again
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF  # a weight byte
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = inspect_model(path).sha256
    assert changed != first and changed == real(bytes(data)).hexdigest() and len(calls) == 4
    # replaced by a rename (a new inode), as an OTA commit does
    om.matmul_model(tmp_path / "new.onnx", k=64, n=64, batch="b")
    os.replace(tmp_path / "new.onnx", path)
    assert inspect_model(path).sha256 == real(path.read_bytes()).hexdigest() and len(calls) == 5
