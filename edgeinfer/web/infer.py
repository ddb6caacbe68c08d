"""``POST /v1/infer?pipeline=NAME``: one image through a pipeline's task and model.

The image's size is read from its header before anything is decoded (a small PNG can claim
100000 x 100000 pixels). The model runs on a handle of its own on the pipeline's pooled model
(`edgeinfer.model.pool`), so the request takes its turn with the pipeline's frames instead of
racing them; the handle is closed after. Tracking and zones are not applied: a single image has
no history.
"""

from __future__ import annotations

import io
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web

from ..errors import EdgeInferError, InvalidInputError
from ..frames import Frame
from ..model.pool import SharedModel
from .auth import error
from .guard import within

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["InferRequests", "ImageRefused", "decode_image"]

IMAGE_TYPES = ("image/jpeg", "image/png", "application/octet-stream")
MAX_AT_ONCE = 2
FORMATS = ("JPEG", "PNG")
"""The image formats ``/v1/infer`` decodes (Pillow is never asked to try any other)."""


class ImageRefused(Exception):
    """An upload that is not an acceptable image; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def decode_image(data: bytes, max_pixels: int) -> np.ndarray:
    """``data`` (a JPEG or PNG) as an H x W x 3 BGR uint8 array.

    Raises:
        ImageRefused: 415 not a JPEG or PNG; 413 more than ``max_pixels``; 400 a broken image.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:  # Pillow's own limit, far above ours
        raise ImageRefused(413, f"image over http.max_pixels ({max_pixels})") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise ImageRefused(415, f"not an image of a format taken here (the {len(data)} bytes "
                                f"start with {data[:8]!r}): send a JPEG or PNG") from None
    width, height = image.size
    if width * height > max_pixels:
        raise ImageRefused(413, f"image of {width}x{height} pixels is over http.max_pixels "
                                f"({max_pixels})")
    try:
        with image:
            rgb = np.asarray(image.convert("RGB"))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageRefused(400, f"the {image.format or 'image'} could not be decoded: "
                                f"{exc}") from None
    return np.ascontiguousarray(rgb[:, :, ::-1])


class InferRequests:
    """Runs uploads through pipelines' models, at most ``MAX_AT_ONCE`` at a time.

    Args:
        max_bytes: The largest upload (``http.max_upload_mb``).
        max_pixels: The largest image (``http.max_pixels``).
    """

    def __init__(self, max_bytes: int, max_pixels: int, body_timeout: float = 60.0) -> None:
        self.max_bytes = max_bytes
        self.max_pixels = max_pixels
        self.body_timeout = body_timeout
        self.calls = 0
        self.refused_busy = 0
        self.busy = 0
        self._lock = threading.Lock()

    async def read_upload(self, request: web.Request) -> bytes | web.Response:
        """The uploaded bytes, or the error response."""
        length = request.content_length
        if length is not None and length > self.max_bytes + 64 * 1024:
            return error(413, f"upload of {length} bytes is over http.max_upload_mb "
                              f"({self.max_bytes} bytes)")
        ctype = request.content_type
        if ctype == "multipart/form-data":
            data = await within(self.body_timeout, _multipart_file(request))
            if isinstance(data, web.Response):
                return data
        elif ctype in IMAGE_TYPES:
            data = await within(self.body_timeout, request.read())
        else:
            return error(415, f"Content-Type {ctype!r}: send {', '.join(IMAGE_TYPES)} or "
                              "multipart/form-data with a file field")
        if len(data) > self.max_bytes:
            return error(413, f"upload of {len(data)} bytes is over http.max_upload_mb "
                              f"({self.max_bytes} bytes)")
        if not data:
            return error(400, "empty upload: send the image as the request body")
        return data

    def try_enter(self) -> bool:
        with self._lock:
            if self.busy >= MAX_AT_ONCE:
                self.refused_busy += 1
                return False
            self.busy += 1
            self.calls += 1
            return True

    def leave(self) -> None:
        with self._lock:
            self.busy -= 1

    def run(self, pipeline: Pipeline, data: bytes) -> dict[str, Any]:
        """Decode ``data`` and run it through ``pipeline``'s task and model (blocking).

        Raises:
            ImageRefused: what to answer.
        """
        image = decode_image(data, self.max_pixels)
        task = pipeline.task
        model = pipeline.model
        if not isinstance(model, SharedModel):
            raise ImageRefused(503, f"pipeline {pipeline.name!r} has a model of its own (not "
                                    "pooled): it cannot take web requests")
        handle = _handle(model, pipeline.name)
        try:
            frame = Frame(index=0, ts=time.monotonic(), wall=time.time(), data=image)
            clock = time.perf_counter
            t0 = clock()
            feeds, context = task.preprocess(frame)
            t1 = clock()
            outputs = handle.run(feeds)
            t2 = clock()
            part = task.postprocess(outputs, frame, context)
            t3 = clock()
        except (InvalidInputError, ValueError) as exc:
            raise ImageRefused(400, f"the image does not fit pipeline {pipeline.name!r}: "
                                    f"{exc}") from None
        except EdgeInferError as exc:
            raise ImageRefused(503, f"pipeline {pipeline.name!r}: {exc}") from None
        finally:
            handle.close()
        return {"pipeline": pipeline.name,
                "model": {"name": model.name, "version": model.version, "sha256": model.sha256},
                "provider": model.provider,
                "latency_ms": {"pre": round((t1 - t0) * 1000, 3),
                               "infer": round((t2 - t1) * 1000, 3),
                               "post": round((t3 - t2) * 1000, 3)},
                "image": {"width": frame.width, "height": frame.height},
                **part.to_dict()}


def image_pipeline_problem(pipeline: Pipeline) -> str | None:
    """Why ``pipeline`` cannot take an uploaded image (``None``: it can)."""
    task = pipeline.task
    if task.stateful:
        return (f"pipeline {pipeline.name!r} runs a stateful {type(task).__name__} on a stream; "
                "/v1/infer takes images")
    if hasattr(task, "preprocessor") and task.preprocessor is None:
        return (f"pipeline {pipeline.name!r} feeds its model non-image data; /v1/infer takes "
                "images")
    return None


def _handle(model: Any, pipeline: str) -> Any:
    """A second handle on ``model``'s pooled entry (closed by the caller)."""
    return model.another(f"web:{pipeline}")


async def _multipart_file(request: web.Request) -> bytes | web.Response:
    try:
        form = await request.post()
    except ValueError as exc:
        return error(400, f"malformed multipart body: {exc}")
    for value in form.values():
        if isinstance(value, web.FileField):
            return bytes(value.file.read())
    return error(400, "multipart/form-data without a file field: add the image as a file")
