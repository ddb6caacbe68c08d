"""edgeinfer: on-device inference for embedded Linux.

    import edgeinfer
    with edgeinfer.load_model("model.onnx", providers="auto", threads=2) as m:
        outputs = m.run({"images": x})

The public names are imported lazily so that ``import edgeinfer`` (and ``edgeinfer --help``)
costs nothing on a small board: no numpy, onnxruntime or LiteRT until a model is loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._importer import lazy_attributes
from .errors import *
from .errors import __all__ as _error_names

from .version import __version__

_LAZY = {
    "load_model": "edgeinfer.model:load_model",
    "Model": "edgeinfer.model:Model",
    "Pipeline": "edgeinfer.pipeline:Pipeline",
    "TensorSpec": "edgeinfer.runtime.base:TensorSpec",
    "set_memory_budget": "edgeinfer.runtime.memory:set_memory_budget",
    "load_config": "edgeinfer.config:load_config",
}

__all__ = ["__version__", *_LAZY, *_error_names]

if TYPE_CHECKING:
    from .config import load_config
    from .model import Model, load_model
    from .pipeline import Pipeline
    from .runtime.base import TensorSpec
    from .runtime.memory import set_memory_budget

__getattr__, __dir__ = lazy_attributes("edgeinfer", _LAZY, globals())
