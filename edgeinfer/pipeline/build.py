"""Building pipelines from config: model, task, source and sinks, in the order that fails
fastest (a model that does not load or does not fit its task is refused before any camera is
opened), and nothing left open when a later part fails."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config.analytics import LineConfig, ZoneConfig, check_frame_size
from ..errors import ConfigError
from ..runtime.batching import batch_policy
from ..sources import Source, discard, open_source
from ..tasks import make_task, task_class
from .gate import make_gate

if TYPE_CHECKING:
    from ..config import Config, PipelineConfig, RuntimeConfig
    from ..model.model import Model
    from .engine import Pipeline, ResultCallback

logger = logging.getLogger("edgeinfer.assembly")  # the name before the move


def select(config: Config, name: str | None) -> PipelineConfig:
    """The pipeline called ``name``, or the only one."""
    if name is not None:
        for p in config.pipelines:
            if p.name == name:
                return p
        names = ", ".join(p.name for p in config.pipelines) or "none"
        raise ConfigError(f"no pipeline named {name!r} (the config has: {names})")
    if len(config.pipelines) != 1:
        raise ConfigError(
            f"the config has {len(config.pipelines)} pipelines; name the one to build"
        )
    return config.pipelines[0]


def build_pipeline(config: PipelineConfig | Config | str, *, name: str | None = None,
                   runtime: RuntimeConfig | None = None, on_result: ResultCallback | None = None,
                   **context: Any) -> Pipeline:
    """See ``Pipeline.from_config``."""
    from ..config import Config, RuntimeConfig, load_config

    if isinstance(config, (str, Path)):
        config = load_config(config)
    where = "$.pipelines[0]"
    if isinstance(config, Config):
        runtime = config.runtime
        chosen = select(config, name)
        where = pipeline_path(config, chosen.name)
        config = chosen
    runtime = runtime or RuntimeConfig()
    source = early_source(config, **context)
    try:
        model = load_pipeline_model(config, runtime)
    except BaseException:
        discard(source)
        raise
    try:
        return assemble(config, model, on_result=on_result,
                        state_dir=runtime.resolved_state_dir(), where=where, source=source,
                        **context)
    except BaseException:
        discard(source)
        model.close()
        raise


def early_source(pc: PipelineConfig, **context: Any) -> Source:
    """The pipeline's source, built (not opened) before its model loads: a camera's capture
    process starts its interpreter and imports meanwhile (``sources/isolated.py``). Hand it
    to ``assemble``; ``discard`` it if the pipeline is not built."""
    return open_source(_sample_video(pc.source), **context)


def load_pipeline_model(pc: PipelineConfig, runtime: RuntimeConfig) -> Model:
    """The pipeline's model with the runtime's directories and limits: the one already loaded
    in this process for the same file and options (shared, `edgeinfer.model.pool`), else loaded.
    ``close()`` it when done: the last pipeline to close a shared model closes it."""
    from ..model.catalog import resolve_model
    from ..model.pool import model_pool

    mc = pc.model
    path = resolve_model(mc.path)
    kwargs = mc.load_kwargs(default_max_model_mb=runtime.max_model_mb)
    for key, value in task_load_options(pc, path).items():
        if not kwargs.get(key):  # what the config says explicitly wins
            kwargs[key] = value
    tag = str(type(pc.task).__struct_config__.tag)
    batch = batch_policy(mc.batch, mc.batch_window_ms, stateful=task_class(tag).stateful)
    if kwargs["probe"] and kwargs["isolation"] == "none":
        # Serve at once: a cached decision under the task's gate opens the winner now,
        # otherwise ``assemble`` starts measuring once the task (and its gate) exists.
        kwargs["probe"] = "background"
        kwargs["gate"] = task_class(tag).gate_key
    return model_pool().acquire(
        path, batch=batch, **kwargs,
        state_dir=runtime.resolved_state_dir(), cache_dir=runtime.resolved_cache_dir(),
        optimized_model_cache=runtime.optimized_model_cache,
    )


def pipeline_path(config: Config, name: str) -> str:
    """The YAML path of the pipeline called ``name`` (``$.pipelines[2]``), for errors."""
    for i, p in enumerate(config.pipelines):
        if p.name == name:
            return f"$.pipelines[{i}]"
    return f"pipeline {name!r}"


def assemble(pc: PipelineConfig, model: Model, *, on_result: ResultCallback | None = None,
             seq_start: int = 0, state_dir: Path | None = None, where: str = "$.pipelines[0]",
             source: Source | None = None, **context: Any) -> Pipeline:
    """Task (checked against the model), analytics, sinks and source around a loaded model.

    ``state_dir`` keeps the analytics' counters and media (default: the platform's state
    directory); ``where`` is the pipeline's YAML path in errors; ``source``: built already
    (``early_source``), else built here."""
    from .engine import Pipeline
    from ..sinks import make_sink

    task = make_task(pc.task, model)
    analytics = _analytics(pc, task, state_dir, where)
    if model.probe and model.worker_pid is None and model.selection is None:
        model.select_backend(task.accuracy_gate(), background=True)  # swaps between frames
    gate = make_gate(pc, task, where)
    sinks = [make_sink(s, **context) for s in pc.sinks]
    if source is None:
        source = open_source(_sample_video(pc.source), **context)
    recorder = analytics.recorder if analytics is not None else None
    if recorder is not None and source.packets is not None:
        recorder.use_packets(source.packets)  # clips cut from the camera's own packets
    return Pipeline(pc.name, source, model, task, sinks, emit=pc.emit, queue_size=pc.queue_size,
                    on_result=on_result, seq_start=seq_start, analytics=analytics, gate=gate)


def _analytics(pc: PipelineConfig, task: Any, state_dir: Path | None, where: str) -> Any:
    """The pipeline's `SceneAnalytics` when it tracks, checked against the task's labels and
    the source's fixed frame size (pixel points outside it are refused before it opens)."""
    if pc.tracking is None:
        return None
    from ..analytics.stage import SceneAnalytics
    from ..paths import state_dir as default_state_dir

    outside = frame_size_problems(pc)
    if outside:
        key, problem = outside[0]
        raise ConfigError(f"{where}.{key}: {problem}")
    labels = getattr(task, "labels", None)
    return SceneAnalytics(pc, class_names=list(labels) if labels else None,
                          state_dir=state_dir or default_state_dir(), where=where)


def frame_size_problems(pc: PipelineConfig) -> list[tuple[str, str]]:
    """``(key, why)`` for each zone or line in pixels outside the frame size the source is set
    to deliver (``zones[0].points``); checked before the source opens, here and by
    ``validate-config``."""
    width, height = getattr(pc.source, "width", None), getattr(pc.source, "height", None)
    if pc.tracking is None or not (isinstance(width, int) and isinstance(height, int)):
        return []
    shapes: list[tuple[str, int, ZoneConfig | LineConfig]] = [
        *(("zones", i, z) for i, z in enumerate(pc.zones)),
        *(("lines", i, ln) for i, ln in enumerate(pc.lines))]
    found = []
    for kind, i, item in shapes:
        problem = check_frame_size(item.points, item.coordinates, width, height)
        if problem:
            found.append((f"{kind}[{i}].points", f"{problem} the source delivers"))
    return found


def _sample_video(source: Any) -> Any:
    """A missing ``demo.mp4`` video is the demo clip from the samples cache (made if needed)."""
    from ..config import VideoSource

    if not isinstance(source, VideoSource):
        return source
    import msgspec

    from ..model.samples import resolve_video

    return msgspec.structs.replace(source, uri=resolve_video(source.uri))


def task_load_options(pc: PipelineConfig, model_path: Path) -> dict[str, Any]:
    """``load_model`` options the task implies: the shapes it will feed (so the model is
    optimized and warmed up for them) and valid warm-up values."""
    options = task_class(str(type(pc.task).__struct_config__.tag)).load_options(pc.task,
                                                                                 pc.source)
    if options:
        return options
    shapes = _shapes_from_preprocess(pc, model_path)
    return {"input_shapes": shapes} if shapes else {}


def _shapes_from_preprocess(pc: PipelineConfig, model_path: Path) -> dict[str, list[int]] | None:
    """A detector or classifier whose preprocessing names a size fixes a dynamic image input
    to it."""
    pre = getattr(pc.task, "preprocess", None)
    if pre is None or not pre.size:
        return None
    from ..runtime.modelfile import inspect_model

    try:
        info = inspect_model(model_path, digest=False)  # load_model hashes it once
    except Exception:  # the real load reports the problem with its own message
        return None
    if info.onnx is None or len(info.onnx.inputs) != 1:
        return None
    ((name, dims),) = info.onnx.inputs.items()
    if len(dims) != 4 or all(isinstance(d, int) for d in dims):
        return None
    width, height = pre.size
    channels_first = dims[1] in (1, 3) or (pre.layout == "nchw")
    if channels_first:
        c = dims[1] if isinstance(dims[1], int) else 3
        return {name: [1, c, height, width]}
    c = dims[3] if isinstance(dims[3], int) else 3
    return {name: [1, height, width, c]}
