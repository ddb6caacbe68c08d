"""``raw``: the model's output tensors as nested lists, for models edgeinfer has no decoder for."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config.pipeline import PreprocessConfig
from ..config.pipeline import RawTask as RawConfig
from ..errors import ConfigError, InvalidInputError
from ..frames import OUTPUTS, Frame, TaskResult
from ..runtime.base import TensorSpec, format_shape
from .base import Task
from .preprocess import Preprocessor, infer_layout

if TYPE_CHECKING:
    from ..model.model import Model

__all__ = ["RawTask"]

DECIMALS = 6
"""Float outputs are rounded to this many decimals (JSON size, not precision, is the concern)."""


class RawTask(Task):
    """Frames in, output tensors out as lists (``TaskResult.outputs``, by output name).

    Image frames go through a ``Preprocessor`` when ``preprocess`` is configured or the model
    has one image-like input (4-D with 1 or 3 channels). Audio and series frames are fed as the
    model's single input when their shape fits (a batch dimension of 1 is added when needed).

    Raises:
        ConfigError: ``preprocess`` is configured for a model whose inputs are not one image.
    """

    Config = RawConfig
    part = OUTPUTS

    def __init__(self, config: RawConfig, model: Model) -> None:
        super().__init__(config, model)
        self.preprocessor: Preprocessor | None = None
        image_like = len(model.inputs) == 1 and infer_layout(model.inputs[0].shape) is not None
        if config.preprocess is not None or image_like:
            if len(model.inputs) != 1:
                raise ConfigError(f"raw preprocess needs a model with one input; {model.name} "
                                  f"has {len(model.inputs)}")
            self.preprocessor = Preprocessor(config.preprocess or PreprocessConfig(),
                                             model.inputs[0])

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]:
        """Feeds for ``frame``: a preprocessed image, or the frame's data shaped to the input.

        Raises:
            InvalidInputError: the frame does not fit the model's input.
        """
        if frame.kind == "image" and self.preprocessor is not None:
            tensor, transform = self.preprocessor(frame.data)
            return {self.model.inputs[0].name: tensor}, transform
        if len(self.model.inputs) != 1:
            raise InvalidInputError(f"a {frame.kind} frame can feed a model with one input; "
                                    f"{self.model.name} has {len(self.model.inputs)}")
        spec = self.model.inputs[0]
        return {spec.name: _fit(frame.data, spec)}, None

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        """Every output by name as nested lists, floats rounded to ``DECIMALS``."""
        return TaskResult(OUTPUTS, {name: _to_list(value) for name, value in outputs.items()})


def _fit(data: np.ndarray, spec: TensorSpec) -> np.ndarray:
    x = np.asarray(data)
    shape = spec.shape
    if len(shape) == x.ndim + 1 and (shape[0] == 1 or not isinstance(shape[0], int)):
        x = x[None]  # the batch of one
    else:
        fixed = [d for d in shape if isinstance(d, int) and d >= 0]
        if len(fixed) == len(shape) and x.size == math.prod(fixed):
            x = x.reshape(fixed)  # e.g. N x C readings into a flat [1, N*C] input
    if len(shape) != x.ndim or any(
            isinstance(d, int) and d >= 0 and d != n for d, n in zip(shape, x.shape)):
        raise InvalidInputError(f"frame data {tuple(data.shape)} does not fit input {spec.name} "
                                f"{format_shape(shape)}")
    return x.astype(spec.dtype if spec.quantization is None else np.float32, copy=False)


def _to_list(value: np.ndarray) -> Any:
    a = np.asarray(value)
    if a.dtype.kind == "f":
        a = np.round(a.astype(np.float64), DECIMALS)
    return a.tolist()
