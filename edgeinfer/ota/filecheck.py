"""The first check of a pushed model (``docs/ota.md``, "Verification"): the staged file's bytes
alone, before anything loads it. Size, sha256, the format read from the bytes, no external data,
the size limit, then the whole ``inspect_model`` walk. Every refusal is an ``OtaRejected``
whose ``reason`` is one of the status reason codes; ``verify.trial_run`` comes next.
"""

from __future__ import annotations

import mmap
from pathlib import Path

from ..errors import (
    ModelError,
    ModelFormatError,
    ModelTooLargeError,
    OtaRejected,
    UnsafeModelError,
)
from ..runtime.modelfile import detect_format, file_sha256, inspect_model, scan_onnx

__all__ = ["check_file"]

_MiB = 1024 * 1024
_FORMATS = ("onnx", "tflite")


def check_file(path: Path, *, sha256: str, size: int, format: str,
               max_model_mb: float) -> None:
    """Check a staged model file against its manifest, from its bytes alone.

    In order: the size (cheap), the size limit, the sha256, the format read from the bytes, ONNX
    external data (refused: a pushed model is one file), then the whole ``inspect_model`` walk.

    Args:
        path: The staged file.
        sha256: The manifest's sha256 (lowercase hex).
        size: The manifest's size in bytes.
        format: The manifest's format, ``"onnx"`` or ``"tflite"``.
        max_model_mb: ``ota.max_model_mb``.

    Raises:
        OtaRejected: ``size_mismatch``, ``oversize``, ``sha256_mismatch``, ``bad_format``,
            ``unsafe_model`` or ``bad_model`` (a file the parser chokes on: subgraphs nested
            past the recursion limit, an external-data location no path can be).
    """
    path = Path(path)
    try:
        actual = path.stat().st_size
    except OSError as exc:
        raise OtaRejected("size_mismatch", f"the staged file {path} cannot be read: "
                                           f"{exc.strerror or exc}") from exc
    if actual != size:
        raise OtaRejected("size_mismatch",
                          f"the file has {actual} bytes, the manifest says {size}")
    if actual > max_model_mb * _MiB:
        raise OtaRejected("oversize", f"the model is {actual / _MiB:.1f} MiB, over "
                                      f"max_model_mb={max_model_mb:g}")
    digest = file_sha256(path)
    if digest != sha256.lower():
        raise OtaRejected("sha256_mismatch",
                          f"the file's sha256 is {digest}, the manifest says {sha256}")
    if format not in _FORMATS:
        raise OtaRejected("bad_format", f"format must be onnx or tflite, the manifest says "
                                        f"{format!r}")
    with open(path, "rb") as f:
        head = f.read(64)
    try:
        found = detect_format(head)
    except ModelFormatError as exc:
        raise OtaRejected("bad_format", str(exc)) from exc
    if found != format:
        raise OtaRejected("bad_format", f"the file is a {found} model, the manifest says "
                                        f"{format}")
    try:
        _check_structure(path, found, max_model_mb)
    except RecursionError:
        raise OtaRejected("bad_model", "the model nests subgraphs deeper than this device "
                                       "parses") from None
    except (ValueError, OSError, MemoryError) as exc:  # a NUL byte, a name too long, ...
        raise OtaRejected("bad_model", f"the model cannot be parsed: {type(exc).__name__}: "
                                       f"{str(exc)[:200]}") from None


def _check_structure(path: Path, found: str, max_model_mb: float) -> None:
    if found == "onnx":
        external = _external_data(path)
        if external:
            names = ", ".join(sorted(repr(e[:80]) for e in external))[:300]
            raise OtaRejected("unsafe_model", f"the ONNX model keeps tensors in external data "
                                              f"files ({names}); a pushed model must be one file")
    try:
        inspect_model(path, max_model_mb=max_model_mb, digest=False)  # hashed above
    except ModelTooLargeError as exc:
        raise OtaRejected("oversize", str(exc)) from exc
    except UnsafeModelError as exc:
        raise OtaRejected("unsafe_model", str(exc)) from exc
    except ModelError as exc:  # ModelFormatError, or the file vanished under us
        raise OtaRejected("bad_format", str(exc)) from exc


def _external_data(path: Path) -> set[str]:
    """The external-data locations an ONNX file names (empty when it cannot be read: the full
    inspection that follows reports that with its own message)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return set(scan_onnx(view, path).external_data)
            finally:
                view.release()
    except (OSError, ValueError, ModelFormatError):
        return set()
