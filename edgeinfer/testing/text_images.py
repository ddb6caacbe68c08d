"""Printed text as PaddleOCR's models take it: text lines for the direction classifier and the
recognizer, pages for the detector, rendered with Pillow's own font (no system fonts) and
normalized as RapidOCR does; and the recognizer's CTC decoding. What tests quantize PP-OCR on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["WORDS", "ctc_text", "det_inputs", "line_inputs", "text_line", "text_page"]

WORDS = ("edge inference", "Hello World", "quantize 2024", "INT8 model", "camera 07",
         "PADDLE OCR", "text line", "42.5 kg", "Room 101", "warning", "ONNX runtime", "Exit",
         "open 9-17", "SALE 50%")

_IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # the detector's mean and std
_HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # the classifier's and recognizer's


def text_line(rng: np.random.Generator, size: tuple[int, int] = (320, 48)) -> np.ndarray:
    """One word or two, dark on a light grey, in a ``(width, height)`` RGB image."""
    w, h = size
    bg = int(rng.integers(190, 256))
    img = Image.new("RGB", (w, h), (bg, bg, bg))
    draw = ImageDraw.Draw(img)
    text = WORDS[int(rng.integers(len(WORDS)))]
    font = ImageFont.load_default(size=int(rng.integers(h * 26 // 48, h * 34 // 48 + 1)))
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    x = int(rng.integers(2, max(3, w - int(right - left) - 2)))
    ink = int(rng.integers(0, 70))
    draw.text((x - left, (h - (bottom - top)) // 2 - top), text, font=font, fill=(ink,) * 3)
    return np.asarray(img)


def text_page(rng: np.random.Generator, size: tuple[int, int] = (320, 320)) -> np.ndarray:
    """Lines of words down a ``(width, height)`` RGB page."""
    w, h = size
    img = Image.new("RGB", (w, h), (245, 245, 240))
    draw = ImageDraw.Draw(img)
    y = int(rng.integers(5, 30))
    while y < h - 40:
        font = ImageFont.load_default(size=int(rng.integers(18, 30)))
        draw.text((int(rng.integers(5, 80)), y), WORDS[int(rng.integers(len(WORDS)))],
                  font=font, fill=(20, 20, 20))
        y += int(rng.integers(40, 70))
    return np.asarray(img)


def _tensor(img: np.ndarray, norm: tuple[Sequence[float], Sequence[float]]) -> np.ndarray:
    x = img.astype(np.float32) / 255
    x = (x - np.asarray(norm[0], np.float32)) / np.asarray(norm[1], np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def line_inputs(n: int, size: tuple[int, int], seed: int, flip_every: int = 0) -> np.ndarray:
    """``n`` text lines as ``n x 1 x 3 x H x W`` inputs of the classifier or recognizer;
    with ``flip_every`` k, every k-th line is turned 180 degrees (the classifier's class 1)."""
    rng = np.random.default_rng(seed)
    lines = [text_line(rng, size) for _ in range(n)]
    if flip_every:
        lines = [img[::-1, ::-1] if i % flip_every == 0 else img for i, img in enumerate(lines)]
    return np.stack([_tensor(img, _HALF) for img in lines])


def det_inputs(n: int, size: tuple[int, int], seed: int) -> np.ndarray:
    """``n`` pages as ``n x 1 x 3 x H x W`` inputs of the detector."""
    rng = np.random.default_rng(seed)
    return np.stack([_tensor(text_page(rng, size), _IMAGENET) for _ in range(n)])


def ctc_text(probs: np.ndarray, charset: Sequence[str]) -> str:
    """Greedy CTC decoding of one ``1 x T x C`` recognizer output: best class per step,
    repeats merged, blanks (class 0) dropped; class k >= 1 is ``charset[k - 1]``, one past the
    end a space (as PaddleOCR appends it)."""
    chars = [*charset, " "]
    out: list[str] = []
    prev = -1
    for k in np.asarray(probs)[0].argmax(-1).tolist():
        if k != prev and k != 0:
            out.append(chars[k - 1])
        prev = k
    return "".join(out)
