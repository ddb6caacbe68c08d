"""Building pipelines from config: model, task, source and sinks, in the order that fails
fastest (a model that does not load or does not fit its task is refused before any camera is
opened), and nothing left open when a later part fails."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import Config, PipelineConfig, RuntimeConfig
    from .model import Model
    from .pipeline import Pipeline, ResultCallback

logger = logging.getLogger(__name__)


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
    from .config import Config, RuntimeConfig, load_config

    if isinstance(config, (str, Path)):
        config = load_config(config)
    if isinstance(config, Config):
        runtime = config.runtime
        config = select(config, name)
    runtime = runtime or RuntimeConfig()
    model = load_pipeline_model(config, runtime)
    try:
        return assemble(config, model, on_result=on_result, **context)
    except BaseException:
        model.close()
        raise


def load_pipeline_model(pc: PipelineConfig, runtime: RuntimeConfig) -> Model:
    """The pipeline's model with the runtime's directories and limits: the one already loaded
    in this process for the same file and options (shared, `edgeinfer.sharing`), else loaded.
    ``close()`` it when done: the last pipeline to close a shared model closes it."""
    from .catalog import resolve_model
    from .sharing import model_pool

    mc = pc.model
    path = resolve_model(mc.path)
    kwargs = mc.load_kwargs(default_max_model_mb=runtime.max_model_mb)
    for key, value in _task_load_options(pc, path).items():
        if not kwargs.get(key):  # what the config says explicitly wins
            kwargs[key] = value
    if kwargs["probe"] and kwargs["isolation"] == "none":
        # Serve at once: a cached decision under the task's gate opens the winner now,
        # otherwise ``assemble`` starts measuring once the task (and its gate) exists.
        from .tasks.gates import gate_key

        kwargs["probe"] = "background"
        kwargs["gate"] = gate_key(str(type(pc.task).__struct_config__.tag))
    return model_pool().acquire(
        path, **kwargs,
        state_dir=runtime.resolved_state_dir(), cache_dir=runtime.resolved_cache_dir(),
        optimized_model_cache=runtime.optimized_model_cache,
    )


def assemble(pc: PipelineConfig, model: Model, *, on_result: ResultCallback | None = None,
             seq_start: int = 0, **context: Any) -> Pipeline:
    """Task (checked against the model), sinks and source around a loaded model."""
    from .pipeline import Pipeline
    from .sinks import make_sink
    from .sources import open_source
    from .tasks import make_task

    task = make_task(pc.task, model)
    if model.probe and model.worker_pid is None and model.selection is None:
        from .tasks.gates import gate_for

        model.select_backend(gate_for(task), background=True)  # swaps between two frames
    sinks = [make_sink(s, **context) for s in pc.sinks]
    source = open_source(_sample_video(pc.source), **context)
    return Pipeline(pc.name, source, model, task, sinks, emit=pc.emit, queue_size=pc.queue_size,
                    on_result=on_result, seq_start=seq_start)


def _sample_video(source: Any) -> Any:
    """A missing ``demo.mp4`` video is the demo clip from the samples cache (made if needed)."""
    from .config import VideoSource

    if not isinstance(source, VideoSource):
        return source
    import msgspec

    from .samples import resolve_video

    return msgspec.structs.replace(source, uri=resolve_video(source.uri))


def _task_load_options(pc: PipelineConfig, model_path: Path) -> dict[str, Any]:
    """``load_model`` options the task implies: the shapes it will feed (so the model is
    optimized and warmed up for them) and valid warm-up values."""
    if type(pc.task).__struct_config__.tag == "vad":
        from .tasks.vad import silero_load_options

        return silero_load_options(getattr(pc.source, "sample_rate", 16000))
    shapes = _shapes_from_preprocess(pc, model_path)
    return {"input_shapes": shapes} if shapes else {}


def _shapes_from_preprocess(pc: PipelineConfig, model_path: Path) -> dict[str, list[int]] | None:
    """A detector or classifier whose preprocessing names a size fixes a dynamic image input
    to it."""
    pre = getattr(pc.task, "preprocess", None)
    if pre is None or not pre.size:
        return None
    from .runtime.modelfile import inspect_model

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
