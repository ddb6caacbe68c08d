"""Changing a running pipeline: ``set`` command values validated like the config file's, and
the annotated snapshot JPEG. Kept out of ``pipeline.py`` so the engine stays about frames:
`tuned` validates and returns a `Tuning`, which `Pipeline.tune` applies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from ..analytics.draw import draw_scene, draw_shapes, encode_jpeg
from ..config._types import Fps
from ..errors import ConfigError
from ..frames import Frame, TaskResult
from ..sources.base import RateLimiter

if TYPE_CHECKING:
    from ..config.pipeline import EmitConfig

__all__ = ["PIPELINE_FIELDS", "TASK_FIELDS", "Tuning", "annotate", "current_settings", "tuned"]

TASK_FIELDS = frozenset({"score_threshold", "iou_threshold", "max_detections", "top_k",
                         "threshold", "min_speech_ms", "min_silence_ms"})
PIPELINE_FIELDS = frozenset({"max_fps", "emit_mode", "min_interval_s"})


@dataclass(frozen=True, slots=True)
class Tuning:
    """The settings a ``set`` gives a pipeline, all validated, for `Pipeline.tune` to apply.

    Attributes:
        task_config: The task's new config; ``None``: unchanged.
        emit: The new ``emit`` settings; ``None``: unchanged.
        limiter: The cap on frames taken from the source from now on; ``None``: no cap.
    """

    task_config: Any
    emit: EmitConfig | None
    limiter: RateLimiter | None


def tuned(name: str, task_config: Any, emit: EmitConfig, limiter: RateLimiter | None,
          changes: dict[str, Any]) -> Tuning:
    """Validate ``changes`` to the pipeline ``name`` against its present task config, emit
    settings and source rate cap (see ``Pipeline.tune``).

    Raises:
        ConfigError: an unknown or untunable field, or a value out of range.
    """
    if not isinstance(changes, dict) or not changes:
        raise ConfigError("give the settings to change as a JSON object, e.g. "
                          '{"score_threshold": 0.5}')
    task_known = {f for f in TASK_FIELDS if task_config is not None and hasattr(task_config, f)}
    unknown = sorted(set(changes) - task_known - PIPELINE_FIELDS)
    if unknown:
        valid = ", ".join(sorted(task_known | PIPELINE_FIELDS))
        raise ConfigError(f"cannot set {', '.join(unknown)} on pipeline {name!r}; "
                          f"tunable: {valid}")
    task_changes = {k: v for k, v in changes.items() if k in task_known}
    new_task_cfg = _validated(task_config, task_changes) if task_changes else None
    emit_changes = {}
    if "emit_mode" in changes:
        emit_changes["mode"] = changes["emit_mode"]
    if "min_interval_s" in changes:
        emit_changes["min_interval_s"] = changes["min_interval_s"]
    new_emit = _validated(emit, emit_changes) if emit_changes else None
    if "max_fps" in changes:
        fps = _converted(changes["max_fps"], Fps | None, "max_fps")  # as a source's max_fps
        limiter = RateLimiter(fps) if fps is not None else None
    return Tuning(new_task_cfg, new_emit, limiter)


def current_settings(task_config: Any, emit: EmitConfig,
                     limiter: RateLimiter | None) -> dict[str, Any]:
    """The tunable settings in force, as ``Pipeline.tune`` returns them."""
    cfg = task_config
    out = {f: getattr(cfg, f) for f in sorted(TASK_FIELDS) if cfg is not None and hasattr(cfg, f)}
    out["max_fps"] = round(1.0 / limiter.interval, 3) if limiter and limiter.interval else None
    out["emit_mode"] = emit.mode
    out["min_interval_s"] = emit.min_interval_s
    return out


def _converted(value: Any, type_: Any, name: str) -> Any:
    """``value`` as the config type ``type_`` (its ranges checked), or a ConfigError."""
    try:
        return msgspec.convert(value, type_, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def _validated(struct: Any, changes: dict[str, Any]) -> Any:
    """``struct`` with ``changes``, checked by msgspec against the struct's own constraints."""
    data = msgspec.to_builtins(struct)
    data.update(changes)
    try:
        return msgspec.convert(data, type(struct), strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc).replace("`$.", "`")) from None


def annotate(frame: Frame, part: TaskResult, quality: int = 85, geometry: Any = ()) -> bytes:
    """JPEG of ``frame`` with ``part``'s boxes and labels drawn (the frame itself untouched),
    and its shapes (keypoints, mask outlines); on a tracked pipeline with track ids, and the
    zones and lines of ``geometry``. A substream frame (``frame.display``) is drawn on as it
    is, its boxes scaled down from main-stream pixels."""
    image = frame.data.copy()
    scale = image.shape[1] / frame.width if frame.display is not None else 1.0
    draw_shapes(image, part.kind.shapes(part.value), scale)  # under the boxes and their labels
    if geometry or any(d.track_id is not None for d in part.detections or ()):
        draw_scene(image, part.detections or (), geometry, scale=scale)
        return encode_jpeg(image, quality)
    import cv2

    for box, text in part.kind.marks(part.value):  # the part's kind says what to draw
        if box is None:
            _plated(image, text, (8, 20), 0.6)
            continue
        x1, y1, x2, y2 = (int(round(v * scale)) for v in box)
        cv2.rectangle(image, (x1, y1), (x2, y2), (0, 255, 0), 2)
        _plated(image, text, (x1, y1), 0.5, above=True)
    return encode_jpeg(image, quality)


def _plated(image: np.ndarray, text: str, at: tuple[int, int], size: float, *,
            above: bool = False) -> None:
    """Green text on a black plate (bare green text vanished on a bright or green scene). With
    ``above``, ``at`` is a box's top-left corner: the plate sits just above the box's line, or
    just inside it at the top of the image, so it never hides the box's outline."""
    import cv2

    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, size, 1)
    x, y = at
    if above:
        y = y - 3 - base if y - 3 - base - th - 3 >= 0 else y + 3 + th + 3
    cv2.rectangle(image, (x - 2, y - th - 3), (x + tw + 2, y + base), (0, 0, 0), cv2.FILLED)
    cv2.putText(image, text, (x, y), cv2.FONT_HERSHEY_SIMPLEX, size, (0, 255, 0), 1,
                cv2.LINE_AA)
