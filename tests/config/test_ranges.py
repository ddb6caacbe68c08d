"""Every number of the config has a finite, sensible range, enforced on the structs.

The numeric fields are found by walking `Config` with ``msgspec.inspect``: a field added later
without a lower and an upper bound fails `test_every_number_has_a_finite_range`, and every
field is fed infinities, nan, huge and (where 0 means nothing sensible) tiny or negative values,
both through ``msgspec.convert`` (what runtime commands use) and through a YAML file.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from msgspec import inspect as mi

from edgeinfer.config import Config, parse_config
from edgeinfer.errors import ConfigError

Step = tuple[str, Any]
Slot = tuple[tuple[Step, ...], tuple[mi.IntType | mi.FloatType | mi.AnyType, ...]]

# Values for required fields, so that a struct is valid around the number under test.
REQUIRED = {
    "name": "p", "model": {"path": "m.onnx"}, "source": {"type": "synthetic"}, "path": "m.onnx",
    "uri": "v.mp4", "port": "/dev/ttyS0", "topic": "t", "decoder": "yolov8", "library": "d.so",
    "points": [[0, 0], [1, 0], [1, 1]],
}
# What a struct's own checks need besides its required fields.
EXTRA: dict[str, dict[str, Any]] = {
    "OtaConfig": {"allow_unsigned": True}, "AudioSource": {"command": "arecord"},
    "LineConfig": {"points": [[0, 0], [1, 1]]},
}
# Scene analytics only exist on a detect pipeline, and media only with a zone or a line.
SCENE = ("$.pipelines[0].track", "$.pipelines[0].zones", "$.pipelines[0].lines",
         "$.pipelines[0].record")
# Motion settings only exist on a motion-gated pipeline: a camera with a detect task.
MOTION = ("$.pipelines[0].motion", "$.pipelines[0].detect")
MASK = "$.pipelines[0].motion.mask[0][0][0]"  # checked like zone points (motion mask tests)
# Zone and line coordinates: any finite number is refused or taken by the geometry checks
# (normalized 0..1, inside the frame, no self-crossing: tests/analytics/test_config.py).
GEOMETRY = {"$.pipelines[0].zones[0].points[0][0]", "$.pipelines[0].lines[0].points[0][0]"}
# A threshold's partner moved out of the way where 0 or 1 is tested (low <= high).
PARTNER = {"$.pipelines[0].track.high_threshold": ("low_threshold", 0.0),
           "$.pipelines[0].track.low_threshold": ("high_threshold", 1.0)}

# Fields where 0 is meaningful (no minimum spacing, a class id, a threshold, an index).
ZERO_OK = {
    "$.pipelines[0].source.camera",
    "$.pipelines[0].model.batch_window_ms",
    "$.pipelines[0].source.uri",
    "$.pipelines[0].task.score_threshold",
    "$.pipelines[0].task.iou_threshold",
    "$.pipelines[0].task.threshold",
    "$.pipelines[0].task.min_speech_ms",
    "$.pipelines[0].task.min_silence_ms",
    "$.pipelines[0].task.classes[0]",
    "$.pipelines[0].task.preprocess.pad_value",
    "$.pipelines[0].task.preprocess.mean[0]",
    "$.pipelines[0].model.warmup_inputs[...]",
    "$.pipelines[0].model.warmup_inputs[...][0]",
    "$.pipelines[0].emit.min_interval_s",
    "$.ota.health.max_error_rate",
    "$.pipelines[0].track.high_threshold",
    "$.pipelines[0].track.low_threshold",
    "$.pipelines[0].track.new_track_threshold",
    "$.pipelines[0].track.match_iou",
    "$.pipelines[0].track.low_match_iou",
    "$.pipelines[0].zones[0].classes[0]",
    "$.pipelines[0].lines[0].classes[0]",
    "$.pipelines[0].record.clips.pre_s",
    "$.pipelines[0].record.clips.post_s",
    "$.pipelines[0].model.recheck.idle_for_s",
    "$.pipelines[0].model.recheck.after_s",
    "$.pipelines[0].model.recheck.drift_for_s",
    "$.pipelines[0].model.recheck.min_interval_s",
    "$.pipelines[0].model.recheck.max_rechecks",
}
# ... and where a negative value is too (a mean to subtract, a model input).
NEGATIVE_OK = {
    "$.pipelines[0].task.preprocess.mean[0]",
    "$.pipelines[0].model.warmup_inputs[...]",
    "$.pipelines[0].model.warmup_inputs[...][0]",
}
ALWAYS_BAD = [math.inf, -math.inf, math.nan, 2**64, -(2**64), 1e300, -1e300]


def numeric_slots(t: mi.Type, steps: tuple[Step, ...] = ()) -> Iterator[Slot]:
    """Every place in the type tree a number can go, with the number types allowed there."""
    if isinstance(t, (mi.IntType, mi.FloatType, mi.AnyType)):  # Any: any number, unchecked
        yield steps, (t,)
    elif isinstance(t, mi.StructType):
        for field in t.fields:
            yield from numeric_slots(field.type, (*steps, ("field", (t, field.name))))
    elif isinstance(t, mi.ListType):
        yield from numeric_slots(t.item_type, (*steps, ("item", t)))
    elif isinstance(t, mi.DictType):
        assert isinstance(t.key_type, mi.StrType), steps
        yield from numeric_slots(t.value_type, (*steps, ("value", t)))
    elif isinstance(t, mi.UnionType):
        numbers = tuple(m for m in t.types if isinstance(m, (mi.IntType, mi.FloatType)))
        if numbers:
            yield steps, numbers
        for member in t.types:
            if not isinstance(member, (mi.IntType, mi.FloatType)):
                yield from numeric_slots(member, (*steps, ("member", member)))
    else:  # another container type needs a case above
        assert isinstance(t, (mi.StrType, mi.BoolType, mi.NoneType, mi.LiteralType)), (steps, t)


def path_of(steps: tuple[Step, ...]) -> str:
    out = "$"
    for kind, arg in steps:
        out += {"field": f".{arg[1]}" if kind == "field" else "", "item": "[0]",
                "value": "[...]", "member": ""}[kind]
    return out


def label(steps: tuple[Step, ...]) -> str:
    """The path, with the struct picked at each tagged union: ``source<camera>.fps``."""
    out = ""
    for kind, arg in steps:
        if kind == "field":
            out += f".{arg[1]}"
        elif kind == "item":
            out += "[0]"
        elif kind == "value":
            out += "[x]"
        elif isinstance(arg, mi.StructType) and arg.tag is not None:
            out += f"<{arg.tag}>"
    return out[1:]


def minimal(struct: mi.StructType) -> dict[str, Any]:
    data: dict[str, Any] = {struct.tag_field: struct.tag} if struct.tag_field else {}
    for field in struct.fields:
        if field.required:
            assert field.name in REQUIRED, f"add a sample for the required field {field.name!r}"
            data[field.name] = REQUIRED[field.name]
    return {**data, **EXTRA.get(struct.cls.__name__, {})}


def lowest(t: mi.Type) -> object:
    assert isinstance(t, (mi.IntType, mi.FloatType)) and t.ge is not None, t
    return t.ge


def place(t: mi.Type, steps: tuple[Step, ...], value: object) -> object:
    """Data of type ``t``, valid apart from ``value`` at ``steps``."""
    if not steps:
        return value
    (kind, arg), rest = steps[0], steps[1:]
    if kind == "field":
        struct, name = arg
        field = next(f for f in struct.fields if f.name == name)
        return {**minimal(struct), name: place(field.type, rest, value)}
    if kind == "item":  # the first item; a list with a minimum length is filled up with valid ones
        padding = [lowest(arg.item_type) for _ in range((arg.min_length or 1) - 1)]
        return [place(arg.item_type, rest, value), *padding]
    if kind == "value":
        return {"x": place(arg.value_type, rest, value)}
    return place(arg, rest, value)


def _pipeline() -> type:
    from edgeinfer.config import PipelineConfig

    return PipelineConfig


def document(steps: tuple[Step, ...], value: object) -> dict[str, Any]:
    data = place(mi.type_info(Config), steps, value)
    assert isinstance(data, dict)
    if "ota" in data:
        data.setdefault("mqtt", {})
    path = path_of(steps)
    if path.startswith(MOTION):
        pipeline = data["pipelines"][0]
        pipeline.update(task={"type": "detect", "decoder": "yolov8"}, source={"type": "camera"})
    if path.startswith(SCENE):
        pipeline = data["pipelines"][0]
        pipeline["task"] = {"type": "detect", "decoder": "yolov8"}
        if "record" in pipeline:
            pipeline["zones"] = [{"name": "z", "points": REQUIRED["points"]}]
        if path in PARTNER:
            key, other = PARTNER[path]
            pipeline["track"][key] = other
    return data


SLOTS = list(numeric_slots(mi.type_info(Config)))


def test_the_walk_finds_the_numbers_it_should() -> None:
    paths = {path_of(steps) for steps, _ in SLOTS}

    assert {
        "$.mqtt.stats_interval_s", "$.mqtt.reconnect.initial_s", "$.mqtt.reconnect.max_s",
        "$.ota.transfer_timeout_s", "$.ota.verify.timeout_s", "$.pipelines[0].source.fps",
        "$.pipelines[0].model.memory_limit_mb", "$.pipelines[0].emit.min_interval_s",
        "$.pipelines[0].model.input_shapes[...][0]", "$.mqtt.commands.max_age_s",
    } <= paths
    assert paths >= ZERO_OK and len(SLOTS) > 60


@pytest.mark.parametrize(("steps", "numbers"), SLOTS, ids=[label(s) for s, _ in SLOTS])
def test_every_number_has_a_finite_range(steps: tuple[Step, ...], numbers: Any) -> None:
    for number in numbers:
        assert not isinstance(number, mi.AnyType), f"{path_of(steps)}: Any takes any number"
        low = number.ge if number.ge is not None else number.gt
        high = number.le if number.le is not None else number.lt
        assert low is not None and high is not None, f"{path_of(steps)} needs both bounds"
        assert math.isfinite(low) and math.isfinite(high) and low < high


def refused(steps: tuple[Step, ...], value: object, tmp_path: Path) -> None:
    path = path_of(steps)
    data = document(steps, value)
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert(data, Config, strict=True)
    assert str(info.value).endswith(f" - at `{path}`"), (value, str(info.value))
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(data), source="c.yaml", base_dir=tmp_path)
    assert f": {path}: " in str(err.value), (value, str(err.value))


def accepted(steps: tuple[Step, ...], value: object, tmp_path: Path) -> None:
    data = document(steps, value)
    msgspec.convert(data, Config, strict=True)
    parse_config(yaml.safe_dump(data), source="c.yaml", base_dir=tmp_path)


@pytest.mark.parametrize(("steps", "numbers"), SLOTS, ids=[label(s) for s, _ in SLOTS])
def test_out_of_range_numbers_are_refused_with_their_path(
    steps: tuple[Step, ...], numbers: Any, tmp_path: Path
) -> None:
    path = path_of(steps)
    bad: list[object] = list(ALWAYS_BAD)
    if path in GEOMETRY:
        kind = "zones" if ".zones[" in path else "lines"
        for value in bad:
            points = [[value, 0], [1, 0], [1, 1]] if kind == "zones" else [[value, 0], [1, 1]]
            data = {"pipelines": [{**minimal(mi.type_info(_pipeline())),
                                   "task": {"type": "detect", "decoder": "yolov8"},
                                   kind: [{"name": "g", "points": points}]}]}
            with pytest.raises(msgspec.ValidationError, match=re.escape(f"at `{path}`")):
                msgspec.convert(data, Config, strict=True)
        return
    if path == MASK:
        for value in bad:
            data = {"pipelines": [{**minimal(mi.type_info(_pipeline())),
                                   "task": {"type": "detect", "decoder": "yolov8"},
                                   "source": {"type": "camera"},
                                   "motion": {"mask": [[[value, 0], [1, 0], [1, 1]]]}}]}
            with pytest.raises(msgspec.ValidationError, match=re.escape(f"at `{path}`")):
                msgspec.convert(data, Config, strict=True)
        return
    if path not in ZERO_OK:
        bad += [0, 0.0, 1e-300, -1]
    elif path not in NEGATIVE_OK:
        bad += [-1, -1e-300]
    for value in bad:
        refused(steps, value, tmp_path)
    for number in numbers:
        kind = int if isinstance(number, mi.IntType) else float
        if number.ge is not None:
            accepted(steps, kind(number.ge), tmp_path)
        if number.le is not None:
            accepted(steps, kind(number.le), tmp_path)
    if path in ZERO_OK:
        accepted(steps, 0, tmp_path)
    if path in NEGATIVE_OK:
        accepted(steps, -1, tmp_path)
