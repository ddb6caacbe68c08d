"""What every detection decoder shares: ``Decoded`` (one frame's candidates) and ``Decoder``
(bind to a model's outputs, check them, read them).

Each decoder checks the model's outputs when it is built and raises ``ConfigError`` naming the
shapes it expected and the ones the model has, so a mismatch is refused at startup. Boxes come
out as x1, y1, x2, y2 in model-input pixels; ``DetectTask`` filters, suppresses and maps them
back to the source image.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from ...errors import ConfigError
from ...runtime.base import Dim, TensorSpec, format_shape
from .grids import other_task
from .meta import read_meta

__all__ = ["FAR", "FITS_UNCONFIRMED", "NEAR", "Decoded", "Decoder", "LayoutRefusal", "Mismatch",
           "sigmoid", "xywh_to_xyxy"]

# Input size a decoder is bound with by ``matches`` when the metadata names none.
NOMINAL_SIZE = (640, 640)

# How near a model came to a decoder that turned it down (``Mismatch.nearness``).
FAR = 0
"""The outputs do not have the decoder's structure (count, ranks)."""
NEAR = 1
"""The structure is the decoder's; one dimension or a fact (anchors, classes, metadata) is off."""
FITS_UNCONFIRMED = 2
"""Every dimension fits; what would tell it from another layout (metadata, a grid count) does
not confirm it."""


class LayoutRefusal(ConfigError):
    """A decoder cannot read these outputs (``Decoder._refuse``).

    Attributes:
        decoder: The decoder's name.
        why: The one thing that does not fit; empty when the outputs lack the decoder's
            structure altogether.
        nearness: ``FAR``, ``NEAR``, or ``FITS_UNCONFIRMED`` (every dimension fits but
            nothing tells this layout from another: the class count is not known).
    """

    def __init__(self, message: str, decoder: str, why: str, unconfirmed: bool = False) -> None:
        super().__init__(message)
        self.decoder = decoder
        self.why = why
        self.nearness = FITS_UNCONFIRMED if unconfirmed else NEAR if why else FAR


class Mismatch(str):
    """Why ``matches`` turned a model down (the text), with the decoder's name, the short
    reason and how near it came (``FAR``, ``NEAR``, ``FITS_UNCONFIRMED``), so that
    ``decoder: auto`` can lead with the closest layouts."""

    decoder: str
    why: str
    nearness: int

    def __new__(cls, text: str, decoder: str, why: str, nearness: int) -> Mismatch:
        self = super().__new__(cls, text)
        self.decoder, self.why, self.nearness = decoder, why or text, nearness
        return self


@dataclass(frozen=True, slots=True)
class Decoded:
    """Candidate detections of one frame, in model-input pixels.

    Attributes:
        boxes: ``(N, 4)`` x1, y1, x2, y2.
        scores: ``(N,)``.
        class_ids: ``(N,)`` integers.
        keypoints: ``(N, K, 2)`` x, y (BlazeFace) or ``(N, K, 3)`` x, y, score (pose) in
            model-input pixels, where the model has them, else ``None``.
        coefficients: ``(N, M)`` per-detection values a task reads besides the box (a
            segmentation head's mask coefficients), else ``None``.
    """

    boxes: np.ndarray
    scores: np.ndarray
    class_ids: np.ndarray
    keypoints: np.ndarray | None = None
    coefficients: np.ndarray | None = None


class Decoder(ABC):
    """Reads one detector family's outputs.

    Args:
        outputs: The model's output specs.
        input_size: ``(width, height)`` of the model input, in pixels.
        metadata: The model file's metadata (ONNX ``metadata_props``), empty where it has none.

    Attributes:
        num_classes: Classes the outputs score, where the shapes say (else ``None``).
    """

    name: ClassVar[str]
    expects: ClassVar[str]
    suppression: ClassVar[Literal["greedy", "weighted", "none"]] = "greedy"
    default_labels: ClassVar[list[str] | None] = None
    hint: ClassVar[str] = ""
    """The layouts this decoder's shape is most often confused with, named when the first
    frames' values show the outputs are not this layout."""
    class_numbering: ClassVar[Literal["dense", "tf"]] = "dense"
    """``tf``: class ids follow the TensorFlow Object Detection COCO numbering (91 ids, 80
    used), so COCO's 80 names would name every class wrong and are refused."""
    letterbox: ClassVar[Literal["center", "top-left"]] = "center"
    """Where the family's own preprocessing puts a letterboxed image: centered (Ultralytics),
    or at the top-left with the padding right and below (YOLOX)."""
    input_values: ClassVar[dict[str, float | list[float]]] = {}
    """``preprocess`` scale/mean/std the family's models were trained with, used when the
    config sets none of the three."""
    pad_value: ClassVar[int | None] = None
    """The letterbox padding the family was trained with, where it is not ``preprocess``'s
    default (MediaPipe pads black); ``None``: the default."""

    def __init__(self, outputs: Sequence[TensorSpec], input_size: tuple[int, int],
                 metadata: Mapping[str, str] | None = None) -> None:
        self.input_size = input_size
        self.metadata: Mapping[str, str] = metadata or {}
        self.num_classes: int | None = None
        # Set by _bind when the outputs are readable but do not look like this layout (a row
        # count that is not the head's grid): a configured decoder logs it and the first
        # frames' values decide; `decoder: auto` does not pick it.
        self.doubt: str | None = None
        self._outputs = tuple(outputs)
        self._bind(self._outputs)

    @classmethod
    def matches(cls, outputs: Sequence[TensorSpec], metadata: Mapping[str, str]) -> bool | str:
        """Whether this decoder reads these outputs, for ``decoder: auto``.

        Returns:
            ``True`` when it does; else why not (a reason for the log and the refusal, a
            ``Mismatch`` saying how near the model came), or ``False`` when the outputs are
            not this family's at all. The default binds the decoder at the input size the
            metadata's ``imgsz`` names (``decoder: auto`` fills it in from the model input),
            else at a nominal 640x640: every dimension its binding checks must fit, a
            ``doubt`` it has is a reason not to pick it, and so is a class count other than
            the metadata's ``names`` (``decoder: auto`` fills them in from the labels).
        """
        try:
            meta = read_meta(metadata)
            bound = cls(outputs, meta.imgsz or NOMINAL_SIZE, metadata)
        except LayoutRefusal as exc:
            return Mismatch(str(exc), cls.name, exc.why, exc.nearness)
        except ConfigError as exc:  # metadata it cannot read
            return Mismatch(str(exc), cls.name, str(exc), NEAR)
        if bound.doubt is not None:
            return Mismatch(f"decoder {cls.name}: {bound.doubt}", cls.name, bound.doubt,
                            FITS_UNCONFIRMED)
        n = bound.num_classes
        if meta.names is not None and n is not None and len(meta.names) != n:
            why = (f"the labels (or the metadata's names) have {len(meta.names)} classes, the "
                   f"outputs score {n}")
            return Mismatch(f"decoder {cls.name}: {why}", cls.name, why, NEAR)
        return True

    def fill_inputs(self, inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray]:
        """Values for the model's inputs other than the image (the same every frame).

        Raises:
            ConfigError: this decoder fills none (the default), or not these.
        """
        if not inputs:
            return {}
        names = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in inputs)
        raise ConfigError(f"decoder {self.name} feeds the model one image input; it also has "
                          f"{names}, which this decoder does not fill: is it the layout of "
                          "another decoder (rtdetr, dfine: an orig_target_sizes input)?")

    @abstractmethod
    def _bind(self, outputs: tuple[TensorSpec, ...]) -> None:
        """Check ``outputs`` (``self._refuse`` if they do not fit) and remember what to read."""

    @abstractmethod
    def __call__(self, outputs: Mapping[str, np.ndarray], score_threshold: float) -> Decoded:
        """Candidates scoring at least ``score_threshold``."""

    def _rows_with_objectness(self, outputs: tuple[TensorSpec, ...]) -> tuple[Dim, int]:
        """``(N, columns)`` of the one ``1 x N x (5+C)`` output YOLOv5/v7 and YOLOX write, after
        refusing the heads of the Ultralytics tasks that are not detection."""
        why = other_task(read_meta(self.metadata))
        if why is not None:
            raise self._refuse(why)
        if len(outputs) != 1 or len(outputs[0].shape) != 3:
            raise self._refuse()
        _, n, cols = outputs[0].shape
        if not isinstance(cols, int) or cols < 6:
            raise self._refuse("dim 2 must be a fixed 5 + classes")
        return n, cols

    def _refuse(self, why: str = "", unconfirmed: bool = False) -> LayoutRefusal:
        """The refusal naming the layout expected and the outputs the model has; ``why``: the
        one thing that does not fit (none: the structure is not this decoder's);
        ``unconfirmed``: every dimension fits, but nothing tells this layout from another."""
        have = ", ".join(f"{s.name} {format_shape(s.shape)}" for s in self._outputs) or "none"
        return LayoutRefusal(f"decoder {self.name} expects {self.expects}; the model has "
                             f"{len(self._outputs)} output(s): {have}"
                             + (f" ({why})" if why else ""), self.name, why, unconfirmed)


def xywh_to_xyxy(cx: np.ndarray, cy: np.ndarray, w: np.ndarray, h: np.ndarray) -> np.ndarray:
    """``(N, 4)`` corners from centers and sizes."""
    hw, hh = w / 2, h / 2
    return np.stack([cx - hw, cy - hh, cx + hw, cy + hh], axis=1)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float32."""
    # The tanh form cannot overflow, unlike 1 / (1 + exp(-x)) at x = -100 in float32.
    return np.asarray(0.5 * np.tanh(0.5 * x) + 0.5, dtype=np.float32)
