"""Typed configuration: the `Config` tree and the YAML loader (``${ENV}``, systemd credentials).

Example::

    from edgeinfer.config import load_config
    config = load_config("/etc/edgeinfer/config.yaml")
    for pipeline in config.pipelines:
        model = edgeinfer.load_model(
            pipeline.model.path,
            **pipeline.model.load_kwargs(default_max_model_mb=config.runtime.max_model_mb),
        )
"""

from __future__ import annotations

from .loader import config_schema, load_config, parse_config
from .schema import (
    Config,
    DelegateConfig,
    LoggingConfig,
    ModelConfig,
    PipelineConfig,
    RuntimeConfig,
)

__all__ = [
    "Config",
    "DelegateConfig",
    "LoggingConfig",
    "ModelConfig",
    "PipelineConfig",
    "RuntimeConfig",
    "config_schema",
    "load_config",
    "parse_config",
]
