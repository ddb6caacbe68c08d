"""Preprocessor: geometry (letterbox round trips against image content), values, layouts, dtypes."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edgeinfer.config.pipeline import PreprocessConfig
from edgeinfer.errors import ConfigError, InvalidInputError
from edgeinfer.runtime.base import TensorSpec
from edgeinfer.tasks.preprocess import Preprocessor, Transform, infer_layout
from edgeinfer.testing.tflite_models import quantize

NCHW = TensorSpec("images", (1, 3, 320, 320), "float32")
NHWC = TensorSpec("input", (1, 128, 128, 3), "float32")
SIZES = {"wide": (640, 480), "tall": (300, 800), "square": (500, 500)}


def _image(w: int, h: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _blob(w: int, h: int, cx: float, cy: float, sigma: float) -> np.ndarray:
    """A white Gaussian spot centred at continuous pixel coordinates (cx, cy) on black."""
    ys, xs = np.mgrid[0:h, 0:w] + 0.5  # pixel centres
    v = 255 * np.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * sigma**2))
    return np.repeat(np.rint(v).astype(np.uint8)[:, :, None], 3, axis=2)


def _centroid(plane: np.ndarray) -> tuple[float, float]:
    ys, xs = np.mgrid[0:plane.shape[0], 0:plane.shape[1]] + 0.5
    total = plane.sum()
    return float((xs * plane).sum() / total), float((ys * plane).sum() / total)


def test_layout_from_the_input_shape() -> None:
    assert infer_layout((1, 3, 320, 320)) == "nchw"
    assert infer_layout((1, 1, 64, 64)) == "nchw"
    assert infer_layout((1, 128, 128, 3)) == "nhwc"
    assert infer_layout(("batch", 3, "height", "width")) == "nchw"
    assert infer_layout((1, 1000)) is None
    assert infer_layout((1, 8, 8, 8)) is None


@pytest.mark.parametrize("kind", sorted(SIZES))
@pytest.mark.parametrize("target", [(320, 320), (320, 256)])
def test_letterbox_points_round_trip(kind: str, target: tuple[int, int]) -> None:
    w, h = SIZES[kind]
    spec = TensorSpec("x", (1, 3, target[1], target[0]), "float32")
    pre = Preprocessor(PreprocessConfig(), spec)
    _, tf = pre(_image(w, h))
    s = min(target[0] / w, target[1] / h)
    assert tf.scale == pytest.approx(s, rel=0.01)
    # Padding centres the picture.
    assert tf.pad_x == (target[0] - round(w * s)) // 2
    assert tf.pad_y == (target[1] - round(h * s)) // 2
    pts = np.random.default_rng(1).uniform((0, 0), (w, h), (200, 2))
    inside = tf.to_input(pts)
    assert (inside >= 0).all() and (inside[:, 0] <= target[0]).all()
    assert (inside[:, 1] <= target[1]).all()
    assert np.abs(tf.to_source(inside) - pts).max() < 0.5


@pytest.mark.parametrize("kind", sorted(SIZES))
@pytest.mark.parametrize("spot", [(0.3, 0.4), (0.75, 0.6)])
def test_letterbox_mapping_matches_the_pixels(kind: str, spot: tuple[float, float]) -> None:
    """A spot found in the model input and mapped back lands where it is in the source."""
    w, h = SIZES[kind]
    cx, cy = spot[0] * w, spot[1] * h
    pre = Preprocessor(PreprocessConfig(pad_value=0), NCHW)
    tensor, tf = pre(_blob(w, h, cx, cy, sigma=0.04 * min(w, h)))
    found = tf.to_source(np.array(_centroid(tensor[0, 0])))
    assert np.abs(found - (cx, cy)).max() < 0.5, (found, (cx, cy))
    # And the other way: the source spot mapped in lands on the spot in the tensor.
    assert np.abs(tf.to_input(np.array([cx, cy])) - _centroid(tensor[0, 0])).max() < 0.5 * tf.scale


def test_boxes_map_back_clipped_to_the_image() -> None:
    tf = Transform(0.5, 0.5, 0.0, 40.0, 640, 480)
    boxes = np.array([[10, 50, 110, 90], [-5, 30, 400, 300]], dtype=np.float32)
    out = tf.boxes_to_source(boxes)
    np.testing.assert_allclose(out[0], [20, 20, 220, 100])
    np.testing.assert_allclose(out[1], [0, 0, 640, 480])


def test_float_defaults_rgb_over_255_letterboxed() -> None:
    img = _image(640, 480)
    tensor, tf = Preprocessor(PreprocessConfig(), NCHW)(img)
    assert tensor.shape == (1, 3, 320, 320) and tensor.dtype == np.float32
    ref = np.full((320, 320, 3), 114, np.uint8)
    ref[40:280] = cv2.resize(img, (320, 240), interpolation=cv2.INTER_LINEAR)
    ref = ref[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255
    np.testing.assert_allclose(tensor, ref, atol=1e-6)
    assert (tf.pad_x, tf.pad_y) == (0.0, 40.0)


def test_nhwc_bgr_mean_std_and_stretch() -> None:
    img = _image(200, 100)
    cfg = PreprocessConfig(resize="stretch", color="bgr", scale=1 / 255,
                           mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    tensor, tf = Preprocessor(cfg, NHWC)(img)
    assert tensor.shape == (1, 128, 128, 3)
    ref = cv2.resize(img, (128, 128)).astype(np.float32) / 255
    ref = (ref - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
    np.testing.assert_allclose(tensor[0], ref, atol=1e-5)
    assert (tf.scale_x, tf.scale_y) == (128 / 200, 128 / 100)


def test_nchw_per_channel_mean_std_in_rgb_order() -> None:
    img = _image(320, 320)
    cfg = PreprocessConfig(mean=[0.5, 0.25, 0.0], std=[0.5, 1.0, 2.0])
    tensor, _ = Preprocessor(cfg, NCHW)(img)
    rgb = img[:, :, ::-1].astype(np.float32) / 255
    for c, (m, s) in enumerate([(0.5, 0.5), (0.25, 1.0), (0.0, 2.0)]):
        np.testing.assert_allclose(tensor[0, c], (rgb[:, :, c] - m) / s, atol=1e-5)


def test_integer_inputs_take_pixels() -> None:
    img = _image(64, 64)
    u8, _ = Preprocessor(PreprocessConfig(), TensorSpec("x", (1, 64, 64, 3), "uint8"))(img)
    assert u8.dtype == np.uint8
    np.testing.assert_array_equal(u8[0], img[:, :, ::-1])
    i8, _ = Preprocessor(PreprocessConfig(), TensorSpec("x", (1, 3, 64, 64), "int8"))(img)
    assert i8.dtype == np.int8
    np.testing.assert_array_equal(i8[0], img[:, :, ::-1].transpose(2, 0, 1).astype(np.int16) - 128)


@pytest.mark.parametrize(("dtype", "quant"), [("uint8", (0.0078125, 128)), ("int8", (1 / 255, -128)),
                                              ("uint8", (1 / 255, 0))])
def test_quantized_inputs_give_floats_that_quantize_back_to_pixels(
        dtype: str, quant: tuple[float, int]) -> None:
    img = _image(32, 32)
    spec = TensorSpec("x", (1, 32, 32, 3), dtype, quantization=quant)
    tensor, _ = Preprocessor(PreprocessConfig(), spec)(img)
    assert tensor.dtype == np.float32
    q = quantize(tensor, *quant, dtype=np.dtype(dtype))
    expected = img[:, :, ::-1].astype(np.int16) - (128 if dtype == "int8" else 0)
    np.testing.assert_array_equal(q[0], expected)


def test_gray_model_input() -> None:
    img = _image(40, 40)
    tensor, _ = Preprocessor(PreprocessConfig(), TensorSpec("x", (1, 1, 40, 40), "float32"))(img)
    ref = cv2.cvtColor(img, cv2.COLOR_BGR2GRAY).astype(np.float32) / 255
    np.testing.assert_allclose(tensor[0, 0], ref, atol=1e-6)


def test_resize_none_feeds_the_frame_as_is() -> None:
    pre = Preprocessor(PreprocessConfig(resize="none"), NHWC)
    img = _image(128, 128)
    tensor, tf = pre(img)
    np.testing.assert_allclose(tensor[0], img[:, :, ::-1] / np.float32(255), atol=1e-6)
    assert (tf.scale, tf.pad_x, tf.pad_y) == (1.0, 0.0, 0.0)
    with pytest.raises(InvalidInputError, match="resize is none"):
        pre(_image(64, 64))


def test_tensors_are_fresh_and_size_changes_are_handled() -> None:
    pre = Preprocessor(PreprocessConfig(), NCHW)
    a, _ = pre(np.zeros((480, 640, 3), np.uint8))
    b, tf = pre(np.full((100, 50, 3), 255, np.uint8))
    assert not np.shares_memory(a, b)
    assert a[0, 0, 100, 100] == 0.0 and b[0, 0, 100, 160] == 1.0
    assert b[0, 0, 100, 10] == pytest.approx(114 / 255)  # the new size's padding is filled
    assert tf.pad_x == 80.0


def test_dynamic_size_needs_config() -> None:
    spec = TensorSpec("images", ("batch", 3, "height", "width"), "float32")
    with pytest.raises(ConfigError, match=r"dynamic size.*preprocess.size"):
        Preprocessor(PreprocessConfig(), spec)
    tensor, _ = Preprocessor(PreprocessConfig(size=[256, 192]), spec)(_image(64, 48))
    assert tensor.shape == (1, 3, 192, 256)


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ConfigError, match="not an image tensor"):
        Preprocessor(PreprocessConfig(), TensorSpec("x", (1, 1000), "float32"))
    with pytest.raises(ConfigError, match="mean has 2 values"):
        Preprocessor(PreprocessConfig(mean=[0.5, 0.5]), NCHW)
    with pytest.raises(InvalidInputError, match="uint8 image"):
        Preprocessor(PreprocessConfig(), NCHW)(np.zeros((8, 8, 3), np.float32))
