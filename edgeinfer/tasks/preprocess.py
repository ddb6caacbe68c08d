"""Image preprocessing: a frame (H x W x 3 uint8 BGR) -> the model's input tensor.

Resize (letterbox, stretch, center crop or none), channel order, layout, scale/mean/std and dtype, with
defaults read from the model's input. It knows nothing of tasks, so quantization calibration can
feed a model exactly what a pipeline feeds it.

A ``Preprocessor`` keeps scratch buffers between calls (the padded canvas is filled once per
source size) and is therefore not thread-safe: one per thread. The tensor it returns is always
a fresh array, so it may be handed to another thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np

from ..config.pipeline import PreprocessConfig
from ..errors import ConfigError, InvalidInputError
from ..runtime.base import Dim, TensorSpec, format_shape

__all__ = ["Anchor", "Preprocessor", "Transform", "infer_layout"]

Layout = Literal["nchw", "nhwc"]
# cv2.multiply and cv2.add with a per-channel scalar (a tuple); typed loosely on purpose (see _convert).
_CV_SCALAR_OPS: tuple[Callable[..., Any], Callable[..., Any]] = (cv2.multiply, cv2.add)
Anchor = Literal["center", "top-left"]


@dataclass(frozen=True, slots=True)
class Transform:
    """Maps model-input pixel coordinates back to source-image pixels.

    ``input = source * scale + pad`` per axis, in continuous pixel coordinates (0 is the left
    edge of the first pixel), the convention of boxes.

    Attributes:
        scale_x, scale_y: Resize factors (equal up to rounding for letterbox, free for stretch).
        pad_x, pad_y: Letterbox padding on the left and top, in model-input pixels.
        width, height: Size of the source image; mapped boxes are clipped to it.
    """

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    width: int
    height: int

    @property
    def scale(self) -> float:
        """The horizontal resize factor (``scale_y`` for the vertical one)."""
        return self.scale_x

    def for_display(self, width: int, height: int) -> Transform:
        """This mapping to the pixels of a ``width`` x ``height`` picture whose scaled copy was
        the source (``Frame.display``: a substream detected on, boxes in main-stream pixels)."""
        if (width, height) == (self.width, self.height):
            return self
        fx, fy = self.width / width, self.height / height
        return Transform(self.scale_x * fx, self.scale_y * fy, self.pad_x, self.pad_y, width,
                         height)

    def to_source(self, points: np.ndarray) -> np.ndarray:
        """Model-input ``(..., 2)`` x, y points -> source pixels (not clipped)."""
        p = np.asarray(points, dtype=np.float64)
        return (p - (self.pad_x, self.pad_y)) / (self.scale_x, self.scale_y)

    def to_input(self, points: np.ndarray) -> np.ndarray:
        """Source ``(..., 2)`` x, y points -> model-input pixels."""
        p = np.asarray(points, dtype=np.float64)
        return p * (self.scale_x, self.scale_y) + (self.pad_x, self.pad_y)

    def boxes_to_source(self, boxes: np.ndarray) -> np.ndarray:
        """``(N, 4)`` x1, y1, x2, y2 boxes in model-input pixels -> source pixels, clipped to
        the image."""
        b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
        out = (b - (self.pad_x, self.pad_y, self.pad_x, self.pad_y)) / (
            self.scale_x, self.scale_y, self.scale_x, self.scale_y)
        np.clip(out[:, 0::2], 0.0, self.width, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0.0, self.height, out=out[:, 1::2])
        return out


def infer_layout(shape: Sequence[Dim]) -> Layout | None:
    """``nchw`` for a 4-D input with 3 or 1 in dim 1, ``nhwc`` with it in dim 3, else ``None``."""
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3):
        return "nchw"
    if shape[3] in (1, 3):
        return "nhwc"
    return None


class Preprocessor:
    """Turns BGR uint8 images into tensors for one model input.

    Args:
        config: What to do; ``None`` fields are read from ``spec``.
        spec: The model input (4-D image tensor).
        anchor: Where a letterboxed image sits: ``center`` (padding split around it), or
            ``top-left`` (padding right and below, as YOLOX's own preprocessing does).

    Defaults: float inputs get ``scale = 1/255`` and no mean/std; uint8 inputs raw pixels; int8
    inputs pixels - 128; a quantized (TFLite) input gets float values such that the backend's
    quantization gives back the pixel values (``scale`` and ``zero_point`` of the tensor).

    Raises:
        ConfigError: the input is not an image tensor, its size is unknown and not configured,
            or ``mean``/``std`` do not match its channels.
    """

    __slots__ = ("alpha", "anchor", "beta", "channels", "color", "crop_fraction", "dtype",
                 "layout", "pad_value", "resize", "size", "_canvas", "_out", "_plan", "_rgb",
                 "_src", "_uniform", "_view")

    def __init__(self, config: PreprocessConfig, spec: TensorSpec, anchor: Anchor = "center"
                 ) -> None:
        layout = config.layout or infer_layout(spec.shape)
        if layout is None or len(spec.shape) != 4:
            raise ConfigError(
                f"input {spec.name!r} {format_shape(spec.shape)} is not an image tensor "
                "(4-D with 1 or 3 channels in dim 1 or 3); set preprocess.layout if it is one")
        self.layout: Layout = layout
        c, h, w = (spec.shape[1:4] if layout == "nchw"
                   else (spec.shape[3], spec.shape[1], spec.shape[2]))
        self.channels = c if isinstance(c, int) and c > 0 else 3
        if self.channels not in (1, 3):
            raise ConfigError(f"input {spec.name!r} {format_shape(spec.shape)} has "
                              f"{self.channels} channels; images have 1 or 3")
        self.resize = config.resize
        if config.crop_fraction is not None and config.resize != "center_crop":
            raise ConfigError(f"preprocess.crop_fraction applies to resize: center_crop only "
                              f"(resize is {config.resize}); remove it or set resize: center_crop")
        self.crop_fraction = config.crop_fraction or 1.0
        self.anchor: Anchor = anchor
        self.size = _size(config, spec, w, h)
        self.color = config.color
        self.pad_value = config.pad_value
        self.dtype = np.dtype(np.float32 if spec.quantization is not None else spec.dtype)
        alpha, beta = _affine(config, spec, self.channels)
        self.alpha: tuple[float, ...] = alpha
        self.beta: tuple[float, ...] = beta
        self._uniform = len(set(alpha)) == 1 and len(set(beta)) == 1
        self._src: tuple[int, int] | None = None
        self._plan: Transform | None = None
        self._canvas: np.ndarray | None = None
        self._view: np.ndarray | None = None
        self._out: np.ndarray | None = None
        self._rgb: np.ndarray | None = None

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, Transform]:
        """The input tensor (batch of 1) for ``image`` and the transform back to its pixels.

        Raises:
            InvalidInputError: not an H x W x 3 (or H x W) uint8 image, or ``resize: none`` with
                a frame of another size than the model's.
        """
        if image.dtype != np.uint8 or image.ndim not in (2, 3):
            raise InvalidInputError(
                f"expected an H x W x 3 uint8 image, got {image.shape} {image.dtype}")
        if image.ndim == 2:
            image = cv2.cvtColor(image, cv2.COLOR_GRAY2BGR)
        h, w = image.shape[:2]
        if (w, h) != self._src:
            self._prepare(w, h)
        assert self._plan is not None
        return self._convert(self._fit(image)), self._plan

    # -- geometry -------------------------------------------------------------------------------
    def _prepare(self, w: int, h: int) -> None:
        tw, th = self.size
        if self.resize == "none":
            if (tw and tw != w) or (th and th != h):
                raise InvalidInputError(
                    f"frame {w}x{h} but the model takes {tw}x{th} and preprocess.resize is none")
            nw, nh, px, py = w, h, 0, 0
        elif self.resize == "stretch":
            nw, nh, px, py = tw, th, 0, 0
        elif self.resize == "center_crop":
            self._prepare_crop(w, h)
            return
        else:
            s = min(tw / w, th / h)
            nw, nh = max(1, round(w * s)), max(1, round(h * s))
            px, py = ((tw - nw) // 2, (th - nh) // 2) if self.anchor == "center" else (0, 0)
        self._plan = Transform(nw / w, nh / h, float(px), float(py), w, h)
        if (nw, nh) == (w, h) and (self.resize == "none" or (w, h) == (tw, th)):
            # The frame already is the model's size: no resize, no canvas.
            self._canvas = self._view = None
        else:
            self._canvas = np.full((th, tw, 3), self.pad_value, dtype=np.uint8)
            self._view = self._canvas[py:py + nh, px:px + nw]
        self._out = self._canvas
        self._rgb = None
        self._src = (w, h)

    def _prepare_crop(self, w: int, h: int) -> None:
        """Scale so that the size over ``crop_fraction`` fits the shorter side, keep the
        centre (torchvision's ``Resize(int(size / fraction))`` + ``CenterCrop(size)``)."""
        tw, th = self.size
        s = max(tw / w, th / h) / self.crop_fraction
        nw, nh = max(tw, int(w * s)), max(th, int(h * s))
        ox, oy = round((nw - tw) / 2), round((nh - th) / 2)
        self._plan = Transform(nw / w, nh / h, float(-ox), float(-oy), w, h)
        self._canvas = self._view = np.empty((nh, nw, 3), np.uint8)
        self._out = self._canvas[oy:oy + th, ox:ox + tw]
        self._rgb = None
        self._src = (w, h)

    def _fit(self, image: np.ndarray) -> np.ndarray:
        if self._view is None:
            return image
        # Into a view of the padded canvas: no separate pad step, the border is written once.
        cv2.resize(image, (self._view.shape[1], self._view.shape[0]), dst=self._view,
                   interpolation=cv2.INTER_LINEAR)
        assert self._out is not None
        return self._out

    # -- values ---------------------------------------------------------------------------------
    def _convert(self, img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        if self.channels == 1:
            gray = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)
            out = np.empty((1, 1, h, w) if self.layout == "nchw" else (1, h, w, 1), self.dtype)
            self._scale_into(gray, 0, out.reshape(h, w))
            return out
        order = (2, 1, 0) if self.color == "rgb" else (0, 1, 2)
        if self.layout == "nchw":
            out = np.empty((1, 3, h, w), self.dtype)
            planes = cv2.split(img)
            for c in range(3):
                self._scale_into(planes[order[c]], c, out[0, c])
            return out
        src = img
        if self.color == "rgb":
            if self._rgb is None or self._rgb.shape != img.shape:
                self._rgb = np.empty_like(img)
            src = cv2.cvtColor(img, cv2.COLOR_BGR2RGB, dst=self._rgb)
        out = np.empty((1, h, w, 3), self.dtype)
        if self._uniform:
            self._scale_into(src, 0, out[0])
        elif self.dtype == np.float32:
            # Tuples are OpenCV scalars, one value per channel. OpenCV 4's stubs know only arrays
            # there and 5's know scalars too: through _CV_SCALAR_OPS one source type-checks on both.
            multiply, add = _CV_SCALAR_OPS
            multiply(src, self.alpha, dst=out[0], dtype=cv2.CV_32F)
            add(out[0], self.beta, dst=out[0])
        else:
            out[0] = _cast(src * np.asarray(self.alpha, np.float32) + np.asarray(self.beta, np.float32),
                           self.dtype)
        return out

    def _scale_into(self, src: np.ndarray, c: int, dst: np.ndarray) -> None:
        a, b = self.alpha[c], self.beta[c]
        if self.dtype.kind == "f":
            np.multiply(src, self.dtype.type(a), out=dst, casting="unsafe")
            if b:
                np.add(dst, self.dtype.type(b), out=dst)
        elif a == 1 and b == 0:
            np.copyto(dst, src, casting="unsafe")
        elif a == 1 and b == -128 and self.dtype == np.int8:
            # uint8 - 128 as int8 is flipping the top bit.
            np.bitwise_xor(src, np.uint8(0x80), out=dst.view(np.uint8))
        else:
            dst[...] = _cast(src * np.float32(a) + np.float32(b), self.dtype)


def _size(config: PreprocessConfig, spec: TensorSpec, w: Dim, h: Dim) -> tuple[int, int]:
    if config.size is not None:
        if len(config.size) != 2:
            raise ConfigError(f"preprocess.size must be [width, height], got {config.size}")
        return int(config.size[0]), int(config.size[1])
    if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0:
        return w, h
    if config.resize == "none":
        return 0, 0
    raise ConfigError(f"input {spec.name!r} {format_shape(spec.shape)} has a dynamic size; "
                      "set preprocess.size: [width, height] (or load the model with input_shapes)")


def _affine(config: PreprocessConfig, spec: TensorSpec, channels: int
            ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel ``alpha, beta`` with ``value = pixel * alpha + beta``."""
    scale, mean = config.scale, config.mean
    if spec.quantization is not None:
        # Float values the backend quantizes back to the pixel values themselves.
        q_scale, zero_point = spec.quantization
        offset = -128 if np.dtype(spec.dtype) == np.int8 else 0
        default_scale, default_mean = q_scale, (zero_point - offset) * q_scale
    elif np.dtype(spec.dtype).kind == "f":
        default_scale, default_mean = 1 / 255, 0.0
    else:
        default_scale, default_mean = 1.0, 128.0 if np.dtype(spec.dtype) == np.int8 else 0.0
    scale = default_scale if scale is None else scale
    means = _per_channel("mean", [default_mean] if mean is None else mean, channels)
    stds = _per_channel("std", [1.0] if config.std is None else config.std, channels)
    if any(s == 0 for s in stds):
        raise ConfigError(f"preprocess.std must not contain 0, got {config.std}")
    alpha = tuple(float(scale / s) for s in stds)
    beta = tuple(float(-m / s) for m, s in zip(means, stds))
    return alpha, beta


def _per_channel(name: str, values: list[float], channels: int) -> list[float]:
    if len(values) == 1:
        return values * channels
    if len(values) != channels:
        raise ConfigError(f"preprocess.{name} has {len(values)} values; the input has "
                          f"{channels} channels (give 1 or {channels})")
    return list(values)


def _cast(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.asarray(np.clip(np.rint(values), info.min, info.max).astype(dtype))
