"""Loaded models: ``load_model`` and ``Model`` (``load``, ``model``), the pool that shares one
session per model file among pipelines (``pool``), the example models (``catalog``) and the
sample pictures and clip (``samples``).

The names are imported lazily, as the package root's are: importing ``edgeinfer.model.catalog``
(the CLI does, for ``edgeinfer models``) must not bring numpy and the runtime with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._importer import import_from_string

_LAZY = {
    "Model": "edgeinfer.model.model:Model",
    "load_model": "edgeinfer.model.load:load_model",
    "DEFAULT_ARENA": "edgeinfer.model.load:DEFAULT_ARENA",
    "DEFAULT_MAX_MODEL_MB": "edgeinfer.model.load:DEFAULT_MAX_MODEL_MB",
    "ARENAS": "edgeinfer.model.load:ARENAS",
    "ISOLATIONS": "edgeinfer.model.load:ISOLATIONS",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:
    from .load import ARENAS as ARENAS
    from .load import DEFAULT_ARENA as DEFAULT_ARENA
    from .load import DEFAULT_MAX_MODEL_MB as DEFAULT_MAX_MODEL_MB
    from .load import ISOLATIONS as ISOLATIONS
    from .load import load_model as load_model
    from .model import Model as Model


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'edgeinfer.model' has no attribute {name!r}")
    value = import_from_string(target)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
