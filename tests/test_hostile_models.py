"""One pipeline's hostile model file is that pipeline's failure, with its reason; the other
pipelines run on, boot after boot (issue 31, item 5). Before, ``edgeinfer run`` exited 70
(``internal error: TypeError``) 0.2 s after the healthy pipeline started, although
``required: false`` is the default."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edgeinfer.config import TASK_CONFIGS, TaskOptions, load_config
from edgeinfer.control.status import pipeline_health
from edgeinfer.daemon import Daemon
from edgeinfer.errors import PipelineBuildError
from edgeinfer.frames import PART_KINDS, Frame, PartKind, TaskResult
from edgeinfer.tasks import TASKS, Task, register_task
from edgeinfer.testing.export_layouts import Planted, pose_model, ultralytics_metadata

SIZE = (320, 320)
POINTS = [np.tile(np.array([[100.0, 100.0, 0.9]], np.float32), (17, 1))]
PERSON = [Planted((80.0, 60.0, 200.0, 300.0), 0, 0.9)]


class _Nothing(PartKind[None]):
    __slots__ = ()

    def to_json(self, value: None) -> Any:
        return None

    def from_json(self, data: Any) -> None:
        return None


class BottomlessConfig(TaskOptions, tag="bottomless", frozen=True):
    """A task whose model no check foresaw: building it recurses without end."""


class BottomlessTask(Task):
    """Stands for any unforeseen exception while a pipeline is built (a decoder, numpy)."""

    Config = BottomlessConfig
    part = _Nothing("nothing_i31")

    def __init__(self, config: BottomlessConfig, model: Any) -> None:
        raise RecursionError("maximum recursion depth exceeded while reading the metadata")

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]:
        raise NotImplementedError

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        raise NotImplementedError


@pytest.fixture
def bottomless() -> Iterator[None]:
    register_task("bottomless", BottomlessTask)
    try:
        yield
    finally:  # other tests list the valid task types
        del TASKS["bottomless"], TASK_CONFIGS.members["bottomless"], PART_KINDS["nothing_i31"]


def _models(folder: Path) -> dict[str, Path]:
    meta = ultralytics_metadata("pose", ["person"], SIZE, kpt_shape="[17, 3]")
    good = pose_model(folder / "good.onnx", PERSON, POINTS, size=SIZE, metadata=meta)
    names = pose_model(folder / "names.onnx", PERSON, POINTS, size=SIZE,
                       metadata={**meta, "names": "{[1]: 'person'}"})  # 34 bytes: a TypeError
    huge = onnx.load(str(good))
    dims = huge.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = 2**31
    onnx.save(huge, str(folder / "huge.onnx"))  # numpy: "array is too big" (a ValueError)
    return {"good": good, "names": names, "huge": folder / "huge.onnx"}


def _until(pred: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what()}")
        time.sleep(0.05)


def test_a_hostile_model_fails_its_pipeline_alone_boot_after_boot(
        tmp_path: Path, bottomless: None) -> None:
    models = _models(tmp_path)

    def pipeline(name: str, model: Path, task: str = "pose") -> dict[str, Any]:
        return {"name": name, "source": {"type": "synthetic", "width": 320, "height": 240,
                                         "fps": 30},
                "model": {"path": str(model), "threads": 1}, "task": {"type": task}}

    config = {"runtime": {"state_dir": str(tmp_path / "state")}, "pipelines": [
        pipeline("bottomless", models["good"], "bottomless"), pipeline("names", models["names"]),
        pipeline("good", models["good"]), pipeline("huge", models["huge"])]}
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))
    for boot in range(2):
        daemon = Daemon(load_config(path), config_path=str(path))
        try:
            daemon.startup()
            assert [p.name for p in daemon.pipelines] == ["good"], boot
            good = daemon.pipelines[0]
            _until(lambda g=good: g.stats.processed >= 3, 30, lambda g=good: str(g.snapshot()))
            failed = pipeline_health(daemon)
            assert failed["good"]["state"] == "running", failed
            assert {k: v["state"] for k, v in failed.items() if k != "good"} == \
                dict.fromkeys(("names", "huge", "bottomless"), "failed"), failed
            assert "metadata 'names' is not a class-id -> name table: \"{[1]: 'person'}\"" in \
                failed["names"]["reason"]
            assert "input 'images' declares [1, 3, 2147483648, 2147483648] float32" in \
                failed["huge"]["reason"] and "export it again" in failed["huge"]["reason"]
            assert failed["bottomless"]["reason"].startswith(
                "pipeline bottomless could not be built: RecursionError: maximum recursion")
            # a restart (the web button, the MQTT command) and a reload fail the same way
            daemon.restart_pipeline("bottomless")
            assert daemon.failed["bottomless"].startswith("pipeline bottomless could not")
            with pytest.raises(PipelineBuildError, match="RecursionError"):
                daemon.reload()  # refused whole, as any reload a pipeline fails; nothing stops
            assert daemon.pipelines == [good] and good.health().ok, good.health().describe()
        finally:
            daemon.shutdown()
