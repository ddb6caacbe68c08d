"""Tasks: pre/post-processing per job, chosen by the config's ``type:`` through a lazy registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._importer import resolve
from .base import Task, label_of, load_labels

if TYPE_CHECKING:
    from ..model.model import Model

TASKS = {
    "classify": "edgeinfer.tasks.classify:ClassifyTask",
    "detect": "edgeinfer.tasks.detect:DetectTask",
    "vad": "edgeinfer.tasks.vad:VadTask",
    "raw": "edgeinfer.tasks.raw:RawTask",
}

__all__ = ["TASKS", "Task", "label_of", "load_labels", "make_task"]


def make_task(config: Any, model: Model) -> Task:
    """The task for a task config struct (its ``type`` tag), checked against ``model``."""
    tag = type(config).__struct_config__.tag
    cls = resolve(TASKS, tag, "task type")
    task: Task = cls(config, model)
    return task
