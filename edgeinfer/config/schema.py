"""The typed config tree: msgspec Structs that a YAML file is validated into.

Field names are a public contract (users' config files depend on them). Every struct rejects
unknown keys and takes keyword arguments only; constraints are ``msgspec.Meta`` annotations so
that msgspec reports a violation together with its path (``$.pipelines[0].model.threads``).
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ..paths import cache_dir, state_dir
from ._types import ConfigStruct, DeviceId, Dim, FilePath, MiB, PipelineName, Threads
from .analytics import LineConfig, RecordConfig, TrackConfig, ZoneConfig
from .http import HttpConfig
from .metrics import MetricsConfig
from .motion import (
    DEFAULT_DETECT_FPS,
    DetectGateConfig,
    GateMode,
    MotionConfig,
    gate_problem,
    resolve_gate,
)
from .mqtt import MqttConfig
from .ota import OtaConfig
from .recheck import RecheckConfig
from .pipeline import (
    TASK_CONFIGS,
    EmitConfig,
    RawTask,
    SinkConfig,
    SourceConfig,
    StdoutSink,
    TaskField,
)

__all__ = [
    "Config",
    "DelegateConfig",
    "LoggingConfig",
    "ModelConfig",
    "PipelineConfig",
    "RuntimeConfig",
]

QueueSize = Annotated[int, Meta(ge=1, le=64)]
# A warm-up value: a number (broadcast to the input's shape) or a flat list of them.
_WarmupNumber = (
    Annotated[int, Meta(ge=-1_000_000_000, le=1_000_000_000)]
    | Annotated[float, Meta(ge=-1e9, le=1e9)]
)
WarmupValue = _WarmupNumber | list[_WarmupNumber]


class LoggingConfig(ConfigStruct, frozen=True):
    """Logging of the daemon.

    Attributes:
        level: The root log level.
    """

    level: Literal["debug", "info", "warning", "error"] = "info"


class RuntimeConfig(ConfigStruct, frozen=True):
    """Process-wide runtime settings.

    Attributes:
        memory_budget_mb: Budget (MiB) every model is admitted against; ``None`` for no budget.
        max_model_mb: Model files larger than this (MiB) are refused.
        state_dir: Durable state (provider decisions, TensorRT engines, model store, outbox);
            ``None`` for ``edgeinfer.paths.state_dir()``.
        cache_dir: Rebuildable caches; ``None`` for ``edgeinfer.paths.cache_dir()``.
        optimized_model_cache: Keep optimized ONNX graphs in the cache directory.
    """

    memory_budget_mb: MiB | None = None
    max_model_mb: MiB = 512.0
    state_dir: FilePath | None = None
    cache_dir: FilePath | None = None
    optimized_model_cache: bool = True

    def resolved_state_dir(self) -> Path:
        """The state directory: ``state_dir`` or the platform default."""
        return Path(self.state_dir) if self.state_dir else state_dir()

    def resolved_cache_dir(self) -> Path:
        """The cache directory: ``cache_dir`` or the platform default."""
        return Path(self.cache_dir) if self.cache_dir else cache_dir()


class DelegateConfig(ConfigStruct, frozen=True):
    """A TFLite delegate library and its options.

    Attributes:
        library: Shared library name or path (``libedgetpu.so.1``), found as ``dlopen`` would.
        options: String options passed to the delegate.
    """

    library: FilePath
    options: dict[str, str] = {}


class ModelConfig(ConfigStruct, frozen=True):
    """One model; mirrors the keyword arguments of ``edgeinfer.load_model``.

    Attributes:
        path: Model file. The loader stores it absolute, relative paths taken from the config
            file's folder.
        name: Name reported in results and stats; ``None`` for the file's stem.
        version: Version reported in results and stats.
        providers: ``"auto"``, ``"cpu"``, or provider names/aliases in order of preference.
        threads: Intra-op threads; ``None`` lets the runtime choose.
        memory_limit_mb: Resident memory (MiB) load + first run may cost; over it, refused.
        isolation: ``"process"`` runs the session in a worker process.
        strict_providers: Fail instead of falling back from the first provider asked for.
        probe: Measure every backend candidate (backend x precision x threads) on the first
            load, refuse those that change the task's answer against fp32, keep the fastest;
            cached in the state directory. The daemon serves on the default meanwhile.
        precision: The lowest arithmetic a candidate may use: fp32, fp16 (also bf16), int8.
        probe_budget_s: How long measuring may take on the first load.
        recheck: When a decision measured under load (other processes busy) is measured
            again, and the model switched between frames to a clearly faster runner-up.
        input_shapes: Fixed shapes for dynamic inputs, by input name.
        arena: Memory arena policy of the runtime.
        delegates: TFLite delegates, tried in order.
        warmup: Run one inference before the model counts as ready.
        warmup_inputs: Values for the warm-up by input name (scalars broadcast), where zeros
            are not valid input for the model, e.g. ``{sr: 16000}``.
        max_model_mb: Overrides ``runtime.max_model_mb`` for this model.
        batch: Pipelines sharing this model may run their waiting frames as one batch:
            ``auto`` measures batch vs one by one on the backend and batches only where it is
            >= 1.1x faster; ``off``; or a batch size 2-64 (always batched when the model takes
            it, padded with copies). Not a ``load_model`` keyword (``ModelPool.acquire``'s).
        batch_window_ms: How long a batch waits for sharers whose frame has not come yet.
    """

    path: FilePath
    name: str | None = None
    version: str | None = None
    providers: str | list[str] = "auto"
    threads: Threads | None = None
    memory_limit_mb: MiB | None = None
    isolation: Literal["none", "process"] = "none"
    strict_providers: bool = False
    probe: bool = True
    precision: Literal["fp32", "fp16", "int8"] = "fp16"
    probe_budget_s: Annotated[float, Meta(ge=0.1, le=600)] = 15.0
    recheck: RecheckConfig = RecheckConfig()
    input_shapes: dict[str, list[Dim]] = {}
    arena: Literal["bounded", "off", "default"] = "bounded"
    delegates: list[DelegateConfig] = []
    warmup: bool = True
    warmup_inputs: dict[str, WarmupValue] = {}
    max_model_mb: MiB | None = None
    batch: Literal["auto", "off"] | Annotated[int, Meta(ge=2, le=64)] = "auto"
    batch_window_ms: Annotated[float, Meta(ge=0, le=50)] = 5.0

    def __post_init__(self) -> None:
        if isinstance(self.batch, int) and self.isolation == "process":
            raise ValueError(f"batch: {self.batch} needs isolation: none (a worker process "
                             "runs one frame at a time); set batch: off, or isolation: none")

    def load_kwargs(self, *, default_max_model_mb: float | None = None) -> dict[str, Any]:
        """Keyword arguments for ``edgeinfer.load_model(self.path, **kwargs)``.

        Every keyword is present (``None`` where unset, which is ``load_model``'s own default);
        ``input_shapes`` is ``None`` when empty and ``delegates`` is a list of
        ``{"library", "options"}`` dicts. Containers are fresh copies.

        Args:
            default_max_model_mb: Used when this model sets no ``max_model_mb``; pass
                ``config.runtime.max_model_mb``.

        Returns:
            The keyword arguments, without ``path``.
        """
        providers = self.providers if isinstance(self.providers, str) else list(self.providers)
        max_mb = self.max_model_mb if self.max_model_mb is not None else default_max_model_mb
        return {
            "providers": providers,
            "threads": self.threads,
            "memory_limit_mb": self.memory_limit_mb,
            "isolation": self.isolation,
            "strict_providers": self.strict_providers,
            "probe": self.probe,
            "precision": self.precision,
            "probe_budget_s": self.probe_budget_s,
            "recheck": self.recheck.to_dict(),
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()} or None,
            "arena": self.arena,
            "delegates": [
                {"library": d.library, "options": dict(d.options)} for d in self.delegates
            ],
            "warmup": self.warmup,
            "warmup_inputs": dict(self.warmup_inputs) or None,
            "max_model_mb": max_mb,
            "name": self.name,
            "version": self.version,
        }


class PipelineConfig(ConfigStruct, frozen=True):
    """One pipeline: a source, a model, a task and its sinks.

    Attributes:
        name: Unique name; becomes an MQTT topic level, so ``[A-Za-z0-9_-]``, 1 to 64 long.
        model: The model this pipeline runs.
        source: Where frames (or audio windows, or sensor readings) come from; one of the
            `SourceConfig` structs, picked by its ``type:``.
        task: How inputs are prepared and outputs decoded (a `TaskOptions`: one of
            `TaskConfig` or a registered task's); default ``raw`` (the output tensors as lists).
        sinks: Where results go (`SinkConfig`); default readable lines on stdout.
        emit: Which results are emitted (every frame or on change, rate limit).
        queue_size: Frames buffered between the pipeline's stages.
        required: A pipeline whose model or source fails at start fails the daemon only if
            required; otherwise it is reported and the other pipelines run.
        track: Give detections a stable ``track_id`` (``detect`` tasks; implied by zones and
            lines).
        zones: Polygon zones: enter, exit, occupancy, dwell and loiter events.
        lines: Counting lines: crossings by direction.
        record: Snapshots and clips of zone and line events (``None``: no media).
        detect: When the model runs: motion gating, detection fps, motion regions,
            stationary objects (``docs/motion.md``).
        motion: The motion detector of a motion-gated pipeline: sensitivity, masks.
    """

    name: PipelineName
    model: ModelConfig
    source: SourceConfig
    task: TaskField = msgspec.field(default_factory=RawTask)
    sinks: list[SinkConfig] = msgspec.field(default_factory=lambda: [StdoutSink()])
    emit: EmitConfig = msgspec.field(default_factory=EmitConfig)
    queue_size: QueueSize = 2
    required: bool = False
    track: TrackConfig | None = None
    zones: Annotated[list[ZoneConfig], Meta(max_length=64)] = []
    lines: Annotated[list[LineConfig], Meta(max_length=64)] = []
    record: RecordConfig | None = None
    detect: DetectGateConfig = msgspec.field(default_factory=DetectGateConfig)
    motion: MotionConfig = msgspec.field(default_factory=MotionConfig)

    def __post_init__(self) -> None:
        problem = gate_problem(self.detect, self.motion, self._source_type,
                               str(type(self.task).__struct_config__.tag), self._image_task,
                               type(self.task).scene)
        if problem:
            raise ValueError(problem)
        scene = self.track is not None or self.zones or self.lines or self.record is not None
        if scene and not type(self.task).scene:
            tag = type(self.task).__struct_config__.tag
            first, *more = able = [t for t, s in TASK_CONFIGS.members.items() if s.scene]
            also = f"; the tasks giving detections: {', '.join(able)}" if more else ""
            raise ValueError(f"track, zones, lines and record need a {first} task (this one is "
                             f"{tag!r}){also}")
        if self.record is not None and not (self.zones or self.lines):
            raise ValueError("record: needs zones or lines (their events get the media)")
        seen: set[str] = set()
        items: list[ZoneConfig | LineConfig] = [*self.zones, *self.lines]
        for item in items:
            if item.name in seen:
                raise ValueError(f"zone and line names must be unique: {item.name!r} is used "
                                 "twice")
            seen.add(item.name)

    @property
    def gate(self) -> GateMode:
        """``motion`` or ``always``: ``detect.gate`` with ``auto`` resolved for this source
        and task."""
        return resolve_gate(self.detect, self._source_type, self._image_task)

    @property
    def detect_fps(self) -> float | None:
        """The most model runs per second (``detect.fps``, ``auto`` resolved); ``None``:
        every frame."""
        fps = self.detect.fps
        if fps == "auto":
            return DEFAULT_DETECT_FPS if self.gate == "motion" else None
        return fps

    @property
    def _source_type(self) -> str:
        return str(type(self.source).__struct_config__.tag)

    @property
    def _image_task(self) -> bool:
        return getattr(self.task, "preprocess", None) is not None or type(self.task).scene

    @property
    def tracking(self) -> TrackConfig | None:
        """The tracker's settings when detections are tracked (``track:``, or implied by
        zones and lines), else ``None``."""
        if self.track is not None:
            return self.track
        return TrackConfig() if (self.zones or self.lines) else None


class Config(ConfigStruct, frozen=True):
    """The whole config file.

    Attributes:
        device_id: This device's MQTT topic level: 1 to 64 of ``[A-Za-z0-9_.-]``, not ``.``
            or ``..``; ``None`` for the hostname (see `resolved_device_id`).
        runtime: Process-wide runtime settings.
        pipelines: The pipelines to run; names are unique.
        logging: Logging settings.
        mqtt: The MQTT broker results, status and stats go to, and commands come from;
            ``None``: no MQTT.
        metrics: The Prometheus endpoint; ``None``: none.
        ota: Signed model updates over MQTT; ``None``: the device takes none.
        http: The local web view and REST API (``docs/web.md``); ``None``: none.
    """

    device_id: DeviceId | None = None
    runtime: RuntimeConfig = msgspec.field(default_factory=RuntimeConfig)
    pipelines: list[PipelineConfig] = []
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    mqtt: MqttConfig | None = None
    metrics: MetricsConfig | None = None
    ota: OtaConfig | None = None
    http: HttpConfig | None = None

    def __post_init__(self) -> None:
        if self.ota is not None and self.mqtt is None:
            raise ValueError("ota: model updates arrive over MQTT; add an mqtt: section")
        first: dict[str, int] = {}
        for i, pipeline in enumerate(self.pipelines):
            j = first.setdefault(pipeline.name, i)
            if j != i:
                raise ValueError(
                    f"duplicate pipeline name {pipeline.name!r}: pipelines[{j}] and pipelines[{i}]"
                )

    def resolved_device_id(self) -> str:
        """``device_id``, or the hostname's first label made into a valid MQTT topic level
        (``pi-kitchen.lan`` -> ``pi-kitchen``: RabbitMQ reads a ``.`` in a topic as a level
        separator and NATS refuses it)."""
        if self.device_id is not None:
            return self.device_id
        # Hostnames are normally [A-Za-z0-9.-] already; anything else would break the topic.
        name = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname().split(".")[0])[:64]
        return name if name and name not in ("group", "reply") else "edgeinfer"
