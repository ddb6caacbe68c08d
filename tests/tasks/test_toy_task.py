"""A task from a test module (``toy_task.py``), registered through ``register_task``, runs end
to end: a YAML config with ``task: {type: toy}``, ``Pipeline.from_config`` with a real ONNX model
and a real ``images`` source, its results' JSON and ``emit: change`` on its own change key, a
config error naming the path, its Home Assistant entities, and ``edgeinfer watch`` reading its
results back. No file of ``edgeinfer/`` names the toy."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgeinfer.cli.watch_cmd import result_from_dict
from edgeinfer.config import TASK_CONFIGS, config_schema, load_config
from edgeinfer.errors import ConfigError
from edgeinfer.frames import PART_KINDS, TaskResult
from edgeinfer.mqtt.discovery import discovery_messages
from edgeinfer.mqtt.topics import Topics
from edgeinfer.pipeline import Pipeline
from edgeinfer.sinks.stdout import format_line
from edgeinfer.tasks import TASKS, register_task

import toy_task  # tests/tasks/toy_task.py

# Frame levels in file order: dark, dark, bright, bright, bright, dark.
LEVELS = [20, 40, 230, 250, 240, 10]


@pytest.fixture
def toy() -> Iterator[type[toy_task.ToyTask]]:
    cls = register_task("toy", "toy_task:ToyTask")
    try:
        yield cls
    finally:  # other tests list the valid task types
        del TASKS["toy"], TASK_CONFIGS.members["toy"], PART_KINDS["brightness"]


@pytest.fixture
def images(tmp_path: Path) -> Path:
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, level in enumerate(LEVELS):
        cv2.imwrite(str(folder / f"{i:02d}.png"), np.full((48, 64, 3), level, np.uint8))
    return folder


def write_config(tmp_path: Path, images: Path, task: str, emit: str = "every") -> Path:
    model = toy_task.brightness_model(tmp_path / "brightness.onnx")
    path = tmp_path / "toy.yaml"
    path.write_text(f"""\
pipelines:
  - name: light
    model: {{path: {model}, providers: [cpu]}}
    source: {{type: images, uri: {images}}}
    task: {task}
    emit: {{mode: {emit}}}
    sinks: [{{type: jsonl, path: {tmp_path / 'out.jsonl'}}}]
""")
    return path


def test_a_registered_task_runs_from_a_yaml_config(toy: type, images: Path,
                                                   tmp_path: Path) -> None:
    config = write_config(tmp_path, images, "{type: toy, threshold: 0.5}")
    results = list(Pipeline.from_config(str(config)))

    assert [r.task.kind for r in results] == [toy_task.BRIGHTNESS] * len(LEVELS)
    assert [r.task.value.bright for r in results] == [v >= 128 for v in LEVELS]
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [d["brightness"]["bright"] for d in lines] == [v >= 128 for v in LEVELS]
    assert lines[2]["brightness"]["level"] == pytest.approx(230 / 255, abs=1e-3)
    assert "detections" not in lines[0] and "outputs" not in lines[0]


def test_emit_change_compares_the_tasks_own_change_key(toy: type, images: Path,
                                                        tmp_path: Path) -> None:
    config = write_config(tmp_path, images, "{type: toy, threshold: 0.5}", emit="change")
    results = list(Pipeline.from_config(str(config)))

    # dark (first), bright at frame 2, dark again at frame 5
    assert [(r.frame.index, r.task.value.bright) for r in results] == [
        (0, False), (2, True), (5, False)]


def test_a_bad_toy_option_names_its_path_and_line(toy: type, images: Path,
                                                  tmp_path: Path) -> None:
    config = write_config(tmp_path, images, "{type: toy, threshold: 2}")
    with pytest.raises(ConfigError, match=r"toy\.yaml:5: \$\.pipelines\[0\]\.task\.threshold: "
                                          r"expected float <= 1\.0"):
        load_config(config)
    config = write_config(tmp_path, images, "{type: toy, threshhold: 0.2}")
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[0\]\.task\.threshhold: unknown "
                                          r"field; did you mean 'threshold'\?"):
        load_config(config)
    config = write_config(tmp_path, images, "{type: tody}")
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[0\]\.task\.type: unknown type 'tody'"
                                          r"; valid: classify, detect, pose, raw, segment, toy, vad"):
        load_config(config)


def test_scene_analytics_need_a_task_that_gives_detections(toy: type, images: Path,
                                                          tmp_path: Path) -> None:
    config = write_config(tmp_path, images, "{type: toy}\n    track: {}")
    with pytest.raises(ConfigError, match=r"\$\.pipelines\[0\]: track, zones, lines and record "
                                          r"need a detect task \(this one is 'toy'\)"):
        load_config(config)


def test_the_schema_lists_the_registered_task(toy: type) -> None:
    task = config_schema()["$defs"]["PipelineConfig"]["properties"]["task"]
    assert task["discriminator"]["mapping"]["toy"] == "#/$defs/ToyConfig"


def test_its_home_assistant_entities_come_from_the_task(toy: type) -> None:
    messages = dict(discovery_messages(Topics("edgeinfer", "cam1"), "cam1", {"light": "toy"},
                                       "homeassistant", "1.0"))
    bright = json.loads(messages["homeassistant/binary_sensor/edgeinfer_cam1/light_bright/config"])
    assert bright["state_topic"] == "edgeinfer/cam1/light/result"
    assert bright["value_template"] == "{{ 'ON' if value_json.brightness.bright else 'OFF' }}"
    assert bright["unique_id"] == "edgeinfer_cam1:light_bright"
    level = json.loads(messages["homeassistant/sensor/edgeinfer_cam1/light_level/config"])
    assert level["value_template"] == "{{ value_json.brightness.level }}"
    assert "homeassistant/sensor/edgeinfer_cam1/light_fps/config" in messages


def test_watch_reads_its_results_back(toy: type, images: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path, images, "{type: toy, threshold: 0.5}")
    result = list(Pipeline.from_config(str(config)))[2]

    back = result_from_dict(json.loads(result.to_json()))
    level = round(result.task.value.level, 4)  # as the JSON has it
    assert back.task == TaskResult(brightness=toy_task.Brightness(level, True))
    assert format_line(back).endswith(f" bright {result.task.value.level:.2f}")
    # the same line as printed live; the latency as the JSON has it (3 decimals): rounded
    # twice, a total of 0.1499 ms prints 0.1 live and 0.2 read back (CI, once)
    assert back.latency_ms.total == pytest.approx(result.latency_ms.total, abs=0.002)
    assert format_line(back) == format_line(dataclasses.replace(result,
                                                                latency_ms=back.latency_ms))


def test_a_task_is_refused_under_a_name_its_config_does_not_carry_or_a_taken_one(
        toy: type[toy_task.ToyTask]) -> None:
    with pytest.raises(ValueError, match=r"ToyTask\.Config must be a TaskOptions struct with "
                                         r"tag='glow'"):
        register_task("glow", toy_task.ToyTask)

    class Other(toy_task.ToyTask):
        pass

    with pytest.raises(ValueError, match=r"task type 'toy' is taken"):
        register_task("toy", Other)
    assert register_task("toy", toy) is toy  # again: nothing changes
    assert "glow" not in TASKS and TASKS["toy"] is toy
