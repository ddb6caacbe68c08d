"""Loaded models: ``load_model`` and ``Model`` (``load``, ``model``), the pool that shares one
session per model file among pipelines (``pool``), the example models (``catalog``) and the
sample pictures and clip (``samples``).

The names are imported lazily, as the package root's are: importing ``edgeinfer.model.catalog``
(the CLI does, for ``edgeinfer models``) must not bring numpy and the runtime with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._importer import lazy_attributes

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

__getattr__, __dir__ = lazy_attributes("edgeinfer.model", _LAZY, globals())
