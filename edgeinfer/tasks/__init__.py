"""Tasks: pre/post-processing per job, chosen by the config's ``type:`` through a lazy registry.

A task from outside the package is added with ``register_task("toy", ToyTask)`` (or
``"module:Class"``): its ``Config`` becomes a valid ``task: {type: toy}`` and its result part
known to ``TaskResult`` and ``edgeinfer watch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._importer import import_from_string, resolve
from ..config.pipeline import register_task_config
from ..frames import register_part_kind
from .base import Entity, Task, label_of, load_labels

if TYPE_CHECKING:
    from ..config.schema import Config
    from ..model.model import Model

TASKS: dict[str, str | type[Task]] = {
    "classify": "edgeinfer.tasks.classify:ClassifyTask",
    "detect": "edgeinfer.tasks.detect:DetectTask",
    "pose": "edgeinfer.tasks.pose:PoseTask",
    "segment": "edgeinfer.tasks.segment:SegmentTask",
    "vad": "edgeinfer.tasks.vad:VadTask",
    "raw": "edgeinfer.tasks.raw:RawTask",
}

__all__ = ["TASKS", "Entity", "Task", "config_problems", "label_of", "load_labels", "make_task",
           "register_task", "task_class", "task_for_gate"]


def task_class(name: str) -> type[Task]:
    """The task class registered as ``name``.

    Raises:
        ConfigError: no such task, naming the valid ones.
    """
    cls: type[Task] = resolve(TASKS, name, "task type")
    return cls


def task_for_gate(key: str) -> type[Task]:
    """The task class whose answers a report or a cached decision names by ``key`` (its
    ``gate_key``; ``Task`` itself for the outputs every task has)."""
    for name in TASKS:
        cls = task_class(name)
        if cls.gate_key == key:
            return cls
    return Task


def config_problems(config: Config) -> list[str]:
    """What the pipelines' tasks find wrong in their settings without loading a model, each
    as ``"$.pipelines[i].task.<key>: <why>"`` (``Task.check_config``)."""
    problems = []
    for i, pc in enumerate(config.pipelines):
        problem = task_class(str(type(pc.task).__struct_config__.tag)).check_config(pc.task)
        if problem:
            problems.append(f"$.pipelines[{i}].task.{problem}")
    return problems


def make_task(config: Any, model: Model) -> Task:
    """The task for a task config struct (its ``type`` tag), checked against ``model``."""
    task: Task = task_class(type(config).__struct_config__.tag)(config, model)
    return task


def register_task(name: str, task: type[Task] | str) -> type[Task]:
    """Add the task ``task`` (a class or ``"module:Class"``, imported now) as ``type: name``.

    Its ``Config`` struct (a `edgeinfer.config.TaskOptions` tagged ``name``) becomes valid in
    config files loaded from now on, and its ``part`` is known to ``TaskResult(<key>=...)`` and
    to reading results back. Registering the same class again changes nothing.

    Raises:
        ValueError: not a `Task` with a ``Config`` tagged ``name``, or the name, the config's
            tag or the part's key is another task's.
    """
    cls = import_from_string(task) if isinstance(task, str) else task
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ValueError(f"register_task({name!r}): {cls!r} is not a Task subclass")
    tag = getattr(getattr(cls, "Config", None), "__struct_config__", None)
    if tag is None or tag.tag != name:
        raise ValueError(f"register_task({name!r}): {cls.__qualname__}.Config must be a "
                         f"TaskOptions struct with tag={name!r}")
    known = TASKS.get(name, cls)
    if known is not cls:
        raise ValueError(f"task type {name!r} is taken by {known}; register under another name")
    register_task_config(cls.Config)
    register_part_kind(cls.part)
    TASKS[name] = cls
    return cls
