"""Typed configuration: the `Config` tree and the YAML loader (``${ENV}``, systemd credentials).

Example::

    from edgeinfer.config import load_config
    config = load_config("/etc/edgeinfer/config.yaml")
    for pipeline in config.pipelines:
        model = edgeinfer.load_model(
            pipeline.model.path,
            **pipeline.model.load_kwargs(default_max_model_mb=config.runtime.max_model_mb),
        )

A pipeline's ``source``, ``task`` and ``sinks`` are tagged unions on their ``type:`` key
(`SourceConfig`, `TaskConfig`, `SinkConfig`); match on the struct class. The task union is
open: a task added with ``edgeinfer.tasks.register_task`` brings its own `TaskOptions` struct::

    match pipeline.source:
        case CameraSource(uri=uri): ...
        case VideoSource(uri=path, loop=loop): ...
"""

from __future__ import annotations

from ._exit import keep_struct_types_at_exit
from .loader import config_schema, load_config, parse_config
from .metrics import MetricsConfig
from .mqtt import HomeAssistantConfig, MqttConfig, OutboxConfig, TlsConfig
from .pipeline import (
    AudioSource,
    CameraSource,
    ClassifyTask,
    DetectTask,
    EmitConfig,
    ImagesSource,
    JsonlSink,
    MqttSink,
    MqttSource,
    Picamera2Source,
    PoseTask,
    PreprocessConfig,
    RawTask,
    ReconnectConfig,
    SegmentTask,
    SerialSource,
    SinkConfig,
    SourceConfig,
    StdoutSink,
    SyntheticSource,
    TASK_CONFIGS,
    TaskConfig,
    TaskOptions,
    VadTask,
    VideoSource,
    register_task_config,
)
from .schema import (
    Config,
    DelegateConfig,
    LoggingConfig,
    ModelConfig,
    PipelineConfig,
    RuntimeConfig,
)

keep_struct_types_at_exit()

__all__ = [
    "TASK_CONFIGS",
    "AudioSource",
    "CameraSource",
    "ClassifyTask",
    "Config",
    "DelegateConfig",
    "DetectTask",
    "EmitConfig",
    "HomeAssistantConfig",
    "ImagesSource",
    "JsonlSink",
    "LoggingConfig",
    "MetricsConfig",
    "ModelConfig",
    "MqttConfig",
    "MqttSink",
    "MqttSource",
    "OutboxConfig",
    "Picamera2Source",
    "PipelineConfig",
    "PoseTask",
    "PreprocessConfig",
    "RawTask",
    "ReconnectConfig",
    "RuntimeConfig",
    "SegmentTask",
    "SerialSource",
    "SinkConfig",
    "SourceConfig",
    "StdoutSink",
    "SyntheticSource",
    "TaskConfig",
    "TaskOptions",
    "TlsConfig",
    "VadTask",
    "VideoSource",
    "config_schema",
    "load_config",
    "parse_config",
    "register_task_config",
]
