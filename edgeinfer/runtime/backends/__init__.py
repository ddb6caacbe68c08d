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

A backend's own options are its module's: its row names the ``load_model`` keywords it takes
(onnxruntime ``arena``, LiteRT ``delegates``) and its module builds and checks them::

    make_options(**keywords) -> BackendOptions   # a frozen struct; ConfigError naming the fix

:func:`backend_options` sends each keyword to its backend; the structs travel in
``SessionSpec.options`` under the backend's name (picklable: the isolated worker gets the spec
whole), and each backend reads its own with :func:`own_options`. What of them a measured
decision depends on each struct says itself (``BackendOptions.decision_key``).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, TypeVar, cast

from ...errors import ConfigError
from ..base import Session, SessionSpec

__all__ = ["BACKENDS", "FORMATS", "Backend", "BackendModule", "BackendOptions", "backend",
           "backend_options", "check_options", "decision_key", "module", "own_options",
           "register_backend"]

T = TypeVar("T")


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


class BackendOptions(Protocol):
    """A backend's own options: a frozen struct its module defines and checks."""

    def decision_key(self) -> dict[str, Any]:
        """The parts of a measured decision's cache key these options add: what changes which
        candidates there are or which wins (``{}``: nothing)."""
        ...


class OptionsModule(Protocol):
    """What a backend module whose row names options exposes besides ``BackendModule``."""

    def make_options(self, **keywords: Any) -> BackendOptions:
        """Its options struct from the keywords its row names (none: the defaults).

        Raises:
            ConfigError: a value it cannot take, saying what it takes.
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
        options: the ``load_model`` keywords that are this backend's own options (its module
            then exposes ``make_options``, see ``OptionsModule``).
    """

    module: str
    formats: tuple[str, ...]
    device: str = "CPU"
    auto: tuple[str, ...] = ()
    dists: tuple[str, ...] = ()
    address_space_hungry: bool = False
    options: tuple[str, ...] = ()


_HERE = __name__

BACKENDS: dict[str, Backend] = {
    "onnxruntime": Backend(f"{_HERE}.onnx", ("onnx",), "CPUExecutionProvider", ("onnx",),
                           ("onnxruntime", "onnxruntime-gpu"), options=("arena",)),
    "openvino": Backend(f"{_HERE}.openvino", ("onnx", "tflite"), "CPU", ("onnx", "tflite"),
                        ("openvino",), address_space_hungry=True),
    "litert": Backend(f"{_HERE}.tflite", ("tflite",), "xnnpack", ("tflite",),
                      ("ai-edge-litert", "tflite-runtime"), options=("delegates",)),
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
                     dists: tuple[str, ...] = (), options: tuple[str, ...] = ()) -> None:
    """Add a backend to the table (see the module's docstring for what ``module_path`` exposes).

    Only measured under ``providers: auto`` for the formats in ``auto``; ``providers: NAME``
    always names it. A cached decision's key includes the versions of ``dists``. ``options``:
    the keywords of :func:`backend_options` that are its own (its module's ``make_options``).

    Raises:
        ConfigError: ``name`` is taken or not a lower-case identifier, a format is unknown, or
            an option keyword is another backend's.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(f"backend name {name!r}: lower-case letters, digits and _ only")
    if name in BACKENDS:
        raise ConfigError(f"backend {name!r} is already registered ({BACKENDS[name].module})")
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise ConfigError(f"backend {name!r}: formats {list(formats)} must be some of "
                          f"{sorted(FORMATS)}")
    owners = {k: n for n, row in BACKENDS.items() for k in row.options}
    taken = [f"{k!r} ({owners[k]}'s)" for k in options if k in owners]
    if taken:
        raise ConfigError(f"backend {name!r}: option {', '.join(taken)} is taken; name yours "
                          f"after the backend ({name}_...)")
    BACKENDS[name] = Backend(module_path, tuple(formats), device, tuple(auto), tuple(dists),
                             options=tuple(options))


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


def backend_options(**keywords: Any) -> dict[str, BackendOptions]:
    """Each backend's options struct, built by its module from the keywords its row names:
    ``SessionSpec.options`` (every backend with options gets one, with its defaults where no
    keyword of its was given).

    Raises:
        ConfigError: a keyword no backend takes, or a value its backend refuses.
    """
    built: dict[str, BackendOptions] = {}
    left = dict(keywords)
    for name, row in BACKENDS.items():
        if row.options:
            mine = {k: left.pop(k) for k in row.options if k in left}
            built[name] = cast(OptionsModule, module(name)).make_options(**mine)
    if left:
        known = sorted(k for row in BACKENDS.values() for k in row.options)
        raise ConfigError(f"unknown backend option {', '.join(sorted(left))}; valid: "
                          f"{', '.join(known)}")
    return built


def own_options(spec: SessionSpec, name: str, kind: type[T]) -> T:
    """Backend ``name``'s options in ``spec`` (its defaults, ``kind()``, where it has none).

    Raises:
        ConfigError: ``spec.options[name]`` is not a ``kind``.
    """
    found = spec.options.get(name)
    if found is None:
        return kind()
    if not isinstance(found, kind):
        raise ConfigError(f"SessionSpec.options[{name!r}] must be a {kind.__name__} (build it "
                          f"with backend_options), got {type(found).__name__}")
    return found


def check_options(spec: SessionSpec) -> None:
    """Refuse options under a name no backend with options has (a typo would go unread).

    Raises:
        ConfigError: naming the backends that take options.
    """
    unknown = sorted(n for n in spec.options if n not in BACKENDS or not BACKENDS[n].options)
    if unknown:
        takers = sorted(n for n, row in BACKENDS.items() if row.options)
        raise ConfigError(f"SessionSpec.options names {', '.join(unknown)}; the backends with "
                          f"options are {', '.join(takers)}")


def decision_key(spec: SessionSpec) -> dict[str, Any]:
    """What each backend's options add to a measured decision's cache key (LiteRT: its
    delegates), its defaults for a backend ``spec.options`` does not name.

    Raises:
        ConfigError: two backends add the same part.
    """
    parts: dict[str, Any] = {}
    for name, row in BACKENDS.items():
        if not row.options:
            continue
        defaults = cast(OptionsModule, module(name)).make_options()
        mine = own_options(spec, name, type(defaults)).decision_key()
        clash = sorted(set(mine) & set(parts))
        if clash:
            raise ConfigError(f"backend {name!r}: decision key part {', '.join(clash)} is taken")
        parts.update(mine)
    return parts
