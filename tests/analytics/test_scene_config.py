"""Scene analytics config: bad geometry and misuse are refused with the YAML path."""

from __future__ import annotations

import pytest

from edgeinfer.config import parse_config
from edgeinfer.errors import ConfigError

BASE = """
pipelines:
  - name: cam
    model: {path: m.onnx}
    source: {type: synthetic}
    task: {type: detect, decoder: yolov8}
"""


def _parse(extra: str, task: str | None = None) -> object:
    text = BASE if task is None else BASE.replace("{type: detect, decoder: yolov8}", task)
    return parse_config(text + extra)


@pytest.mark.parametrize(("extra", "where", "why"), [
    ("    zones: [{name: z, points: [[0, 0], [1, 0]]}]\n", "$.pipelines[0].zones[0].points",
     "length >= 3"),
    ("    zones: [{name: z, points: [[0, 0], [1, 1], [1, 0], [0, 1]]}]\n",
     "$.pipelines[0].zones[0]", "crosses itself"),
    ("    zones: [{name: z, points: [[0, 0], [0.5, 0], [1, 0]]}]\n",
     "$.pipelines[0].zones[0]", "no area"),
    ("    zones: [{name: z, points: [[0, 0], [0, 0], [1, 0]]}]\n",
     "$.pipelines[0].zones[0]", "at least 3 distinct"),
    ("    zones: [{name: z, points: [[0, 0], [1.5, 0], [1, 1]]}]\n",
     "$.pipelines[0].zones[0]", "outside the frame"),
    ("    zones: [{name: z, points: [[0, 0], [-5, 0], [1, 1]], coordinates: pixels}]\n",
     "$.pipelines[0].zones[0]", "outside the frame"),
    ("    lines: [{name: l, points: [[0.5, 0.5], [0.5, 0.5]]}]\n",
     "$.pipelines[0].lines[0]", "zero length"),
    ("    lines: [{name: l, points: [[0.5, 0.5]]}]\n", "$.pipelines[0].lines[0].points",
     "length >= 2"),
    ("    lines: [{name: 'a b', points: [[0, 0], [1, 1]]}]\n", "$.pipelines[0].lines[0].name",
     ""),
    ("    zones: [{name: x, points: [[0, 0], [1, 0], [1, 1]]}]\n"
     "    lines: [{name: x, points: [[0, 0], [1, 1]]}]\n", "$.pipelines[0]", "unique"),
    ("    track: {low_threshold: 0.9, high_threshold: 0.5}\n", "$.pipelines[0].track",
     "low_threshold"),
    ("    record: {}\n", "$.pipelines[0]", "needs zones or lines"),
])
def test_bad_scene_config_names_the_path(extra: str, where: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        _parse(extra)
    message = str(info.value)
    assert where in message and why in message, message


def test_scene_needs_a_detect_task() -> None:
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[0\].*detect task"):
        _parse("    lines: [{name: l, points: [[0, 0], [1, 1]]}]\n", task="{type: classify}")


def test_zones_imply_tracking_with_defaults() -> None:
    config = _parse("    zones: [{name: door, points: [[0, 0], [1, 0], [1, 1]], "
                    "classes: [person], loiter_s: 5}]\n")
    pc = config.pipelines[0]  # type: ignore[attr-defined]
    assert pc.tracking is not None and pc.tracking.max_lost == 30
    assert pc.zones[0].anchor == "bottom_center" and pc.zones[0].loiter_s == 5
    assert pc.record is None


def test_untracked_pipeline_has_no_tracking() -> None:
    assert _parse("").pipelines[0].tracking is None  # type: ignore[attr-defined]
