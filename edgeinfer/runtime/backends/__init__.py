"""The backends, one table: every runtime that can run a model, and how the selector treats it.

A backend is a module exposing four functions (the ``BackendModule`` protocol below)::

    open_session(spec: SessionSpec) -> Session   # build, verify and warm; spec.choice: exact
    available() -> bool                           # its library imports here
    precisions() -> tuple[str, ...]               # Choice.precision values it runs here
    version() -> str                              # its library's version

and a row here saying which model formats it reads and which ``Choice.device`` its candidates
carry. ``providers: NAME`` (and ``auto``, for the formats in ``auto``) then measures it, and a
cached decision naming it opens it (``candidates.admissible`` refuses a name not in the table).
Adding a backend is that module and one row:
``register_backend("mine", "package.mine", formats=("onnx",))`` from outside the package.
Nothing here imports a backend module, let alone its library, until a model needs it.

Options that only one backend reads stay its own: onnxruntime's ``arena`` and LiteRT's
``delegates`` are read only by ``onnx.py`` and ``tflite.py`` (they still travel on the shared
``SessionSpec`` because ``load_model`` takes them as keywords and the isolated worker pickles
the spec whole).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol, cast

from ...errors import ConfigError
from ..base import Session, SessionSpec

__all__ = ["BACKENDS", "FORMATS", "Backend", "BackendModule", "backend", "module",
           "register_backend"]


class BackendModule(Protocol):
    """What a backend module exposes (a row in ``runtime/backends/__init__.py`` names it)."""

    def open_session(self, spec: SessionSpec) -> Session:
        """Open ``spec.choice`` exactly (measuring, cached decisions), else the backend's own
        best for ``spec``; verified and, with ``spec.warmup``, warmed up."""
        ...

    def available(self) -> bool:
        """Whether its library imports here."""
        ...

    def precisions(self) -> tuple[str, ...]:
        """The ``Choice.precision`` values it runs on this machine (``fp32`` at least)."""
        ...

    def version(self) -> str:
        """Its library's version.

        Raises:
            BackendUnavailableError: the library is not installed.
        """
        ...


@dataclass(frozen=True, slots=True)
class Backend:
    """One row of the table.

    Attributes:
        module: the backend module's import path.
        formats: model formats it reads (``"onnx"``, ``"tflite"``).
        device: the ``Choice.device`` of its candidates (``"CPU"``, ``"CpuAcc"``).
        auto: formats for which ``providers: auto`` measures it.
        dists: distributions whose installed versions key cached decisions (read from their
            metadata, without importing them: a new version measures again).
        address_space_hungry: not measured under RLIMIT_AS (``isolation: process`` with
            ``memory_limit_mb``), where it would reserve past the limit and crash the worker.
    """

    module: str
    formats: tuple[str, ...]
    device: str = "CPU"
    auto: tuple[str, ...] = ()
    dists: tuple[str, ...] = ()
    address_space_hungry: bool = False


_HERE = __name__

BACKENDS: dict[str, Backend] = {
    "onnxruntime": Backend(f"{_HERE}.onnx", ("onnx",), "CPUExecutionProvider", ("onnx",),
                           ("onnxruntime", "onnxruntime-gpu")),
    "openvino": Backend(f"{_HERE}.openvino", ("onnx", "tflite"), "CPU", ("onnx", "tflite"),
                        ("openvino",), address_space_hungry=True),
    "litert": Backend(f"{_HERE}.tflite", ("tflite",), "xnnpack", ("tflite",),
                      ("ai-edge-litert", "tflite-runtime")),
    # Debian's python3-pyarmnn has no distribution metadata: the decision key notes whether it
    # is present instead (decision.py)
    "armnn": Backend(f"{_HERE}.armnn", ("tflite",), "CpuAcc", ("tflite",)),
}
"""Backend name (``Choice.backend``, a ``providers`` entry) -> its row."""

FORMATS: dict[str, str] = {"onnx": "onnxruntime", "tflite": "litert"}
"""Model format -> its own backend: the one that serves without measuring (``probe`` off) and
whose plain fp32 kernels are the reference the others are checked against."""

_NAME = re.compile(r"[a-z][a-z0-9_]*")


def register_backend(name: str, module_path: str, *, formats: tuple[str, ...],
                     device: str = "CPU", auto: tuple[str, ...] = (),
                     dists: tuple[str, ...] = ()) -> None:
    """Add a backend to the table (see the module's docstring for what ``module_path`` exposes).

    Only measured under ``providers: auto`` for the formats in ``auto``; ``providers: NAME``
    always names it. A cached decision's key includes the versions of ``dists``.

    Raises:
        ConfigError: ``name`` is taken or not a lower-case identifier, or a format is unknown.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(f"backend name {name!r}: lower-case letters, digits and _ only")
    if name in BACKENDS:
        raise ConfigError(f"backend {name!r} is already registered ({BACKENDS[name].module})")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ConfigError(f"backend {name!r}: formats {list(formats)} must be some of "
                          f"{sorted(FORMATS)}")
    BACKENDS[name] = Backend(module_path, tuple(formats), device, tuple(auto), tuple(dists))


def backend(name: str) -> Backend:
    """The row of ``name``.

    Raises:
        ConfigError: no such backend (the message lists the valid ones).
    """
    try:
        return BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; valid: {', '.join(sorted(BACKENDS))}") \
            from None


def module(name: str) -> BackendModule:
    """Import backend ``name``'s module (not its library: that waits for a session).

    Raises:
        ConfigError: no such backend.
    """
    imported: ModuleType = importlib.import_module(backend(name).module)
    return cast(BackendModule, imported)
