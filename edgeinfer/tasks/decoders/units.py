"""Box units: model-input pixels, or fractions (0..1) of the input size.

Ultralytics' ONNX exports write pixels, its TFLite exports fractions; YOLOv5's TFLite export
fractions too; RT-DETR always fractions. Where the decoder or the metadata does not know, the
first frame with candidates decides (a real box in pixels has some coordinate above 1.5 px),
and the decision is logged, so it is never a silent guess. A later frame that contradicts a
``normalized`` decision stops the pipeline.
"""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np

from ...errors import OutputLayoutError

__all__ = ["BoxUnits"]

logger = logging.getLogger(__name__)

Units = Literal["pixels", "normalized"]

# Largest coordinate a normalized box can have (a box past the image edge, centre near it);
# above it the coordinates are pixels.
NORMALIZED_MAX = 1.5


class BoxUnits:
    """Turns one decoder's boxes into model-input pixels.

    Args:
        decoder: The decoder's name, for the log and errors.
        input_size: ``(width, height)`` of the model input.
        units: ``pixels`` or ``normalized`` where known, ``None`` to decide on the first boxes.
        hint: The layouts most likely meant when boxes read as fractions turn out pixels (the
            decoder's ``hint``), named in the error.
    """

    __slots__ = ("decoder", "hint", "units", "_scale")

    def __init__(self, decoder: str, input_size: tuple[int, int], units: Units | None = None,
                 hint: str = "") -> None:
        self.decoder = decoder
        self.hint = hint
        self.units: Units | None = units
        w, h = input_size
        self._scale = np.array([w, h, w, h], dtype=np.float32)

    def to_pixels(self, boxes: np.ndarray) -> np.ndarray:
        """``(N, 4)`` x1, y1, x2, y2 in the model's units -> model-input pixels.

        Raises:
            OutputLayoutError: boxes read as fractions before now exceed the input.
        """
        if len(boxes) == 0:
            return boxes
        peak = float(np.abs(boxes).max())
        if self.units is None:
            self.units = "normalized" if peak <= NORMALIZED_MAX else "pixels"
            logger.info("decoder %s: box coordinates read as %s (largest %.3g on the first frame "
                        "with detections)", self.decoder,
                        "fractions of the input (0..1)" if self.units == "normalized"
                        else "input pixels", peak)
        if self.units == "pixels":
            return boxes
        if peak > 2 * NORMALIZED_MAX:
            raise OutputLayoutError(
                f"decoder {self.decoder}: box coordinates up to {peak:.4g}, but they were read as "
                "fractions of the input (0..1): the outputs are not the layout this decoder reads"
                + (f"; likely {self.hint}" if self.hint else ""))
        return boxes * self._scale
