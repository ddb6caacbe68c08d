"""A task from outside the package, registered through the tasks' public way
(``edgeinfer.tasks.register_task``) by ``test_toy_task.py``: proof that a task is one module.

``toy`` tells how bright a frame is: its model (``brightness_model``, built with onnx.helper)
averages the pixels of an 8 x 8 RGB input scaled to 0..1, and the task calls the frame bright
at or above its ``threshold``. It brings everything a task carries: its config struct, its own
kind of result part (``brightness``: serialized, read back, its change key), its Home Assistant
entities. Nothing in ``edgeinfer/`` names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import cv2
import numpy as np
import onnx
from msgspec import Meta
from onnx import TensorProto, helper

from edgeinfer.config import TaskOptions
from edgeinfer.errors import ConfigError
from edgeinfer.frames import Frame, PartKind, TaskResult
from edgeinfer.tasks import Entity, Task

SIZE = 8


def brightness_model(path: Path) -> Path:
    """``level = mean(image)`` over an ``image`` 1 x 3 x 8 x 8 float input, output [1]."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["image"], ["level"], axes=[1, 2, 3], keepdims=0)],
        "brightness",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("level", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return path


class ToyConfig(TaskOptions, tag="toy", frozen=True):
    """How bright a frame is.

    Attributes:
        threshold: A frame whose mean level (0..1) is at least this is bright.
    """

    threshold: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5


@dataclass(frozen=True, slots=True)
class Brightness:
    level: float
    bright: bool


class BrightnessPart(PartKind[Brightness]):
    """The toy's answer in a result: ``"brightness": {"level": 0.81, "bright": true}``."""

    __slots__ = ()

    def to_json(self, value: Brightness) -> Any:
        return {"level": round(value.level, 4), "bright": value.bright}

    def from_json(self, data: Any) -> Brightness:
        return Brightness(float(data["level"]), bool(data["bright"]))

    def change_key(self, value: Brightness) -> Any:
        return value.bright

    def describe(self, value: Brightness) -> str:
        return f"{'bright' if value.bright else 'dark'} {value.level:.2f}"


BRIGHTNESS = BrightnessPart("brightness")


class ToyTask(Task):
    Config = ToyConfig
    part = BRIGHTNESS
    gate_key: ClassVar[str] = "outputs"

    def __init__(self, config: ToyConfig, model: Any) -> None:
        super().__init__(config, model)
        names = [o.name for o in model.outputs]
        if names != ["level"]:
            raise ConfigError(f"toy needs a model with one output 'level'; got {names}")

    @classmethod
    def ha_entities(cls, pipeline: str, result_topic: str) -> list[Entity]:
        return [
            ("binary_sensor", "bright", {
                "name": f"{pipeline} bright", "state_topic": result_topic,
                "value_template": "{{ 'ON' if value_json.brightness.bright else 'OFF' }}",
                "device_class": "light"}),
            ("sensor", "level", {
                "name": f"{pipeline} level", "state_topic": result_topic,
                "state_class": "measurement",
                "value_template": "{{ value_json.brightness.level }}"}),
        ]

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]:
        small = cv2.resize(frame.data, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
        image = small.astype(np.float32).transpose(2, 0, 1)[None] / 255.0
        return {"image": np.ascontiguousarray(image)}, None

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        level = float(np.asarray(outputs["level"]).reshape(-1)[0])
        return TaskResult(BRIGHTNESS, Brightness(level, level >= self.config.threshold))
