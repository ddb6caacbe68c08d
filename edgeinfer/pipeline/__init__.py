"""Pipelines: the engine (a thread per stage: capture, infer, emit), ``build`` (a pipeline from
its config: model, task, source, sinks, analytics), ``emission`` (which results go out) and
``tuning`` (settings changed while running, annotated frames)."""

from __future__ import annotations

from .engine import Pipeline, ResultCallback

__all__ = ["Pipeline", "ResultCallback"]
