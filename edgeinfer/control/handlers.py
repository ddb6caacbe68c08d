"""The command verbs' handlers, one table for every way a command arrives: MQTT
(`edgeinfer.control.commands.CommandServer`) and the web view's ``POST /v1/commands/<verb>``
(`edgeinfer.web`). Each handler takes the request object (already decoded and policy-checked)
and returns the result object; a bad request raises `CommandError`.

What a handler needs from the daemon is small: the running pipelines and a reload of
`edgeinfer.host.Host`. The status payload and where a snapshot goes are given by the caller,
so this module imports neither the daemon nor MQTT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..config.commands import ResetArgs, SnapshotArgs
from ..errors import StateError
from ..host import Host
from ..pipeline import Pipeline
from .commands import CommandError, Handler, no_other_args, pipeline_arg

__all__ = ["CommandHandlers"]


class CommandHandlers:
    """The handlers of the command verbs.

    Args:
        host: The daemon (its pipelines, reload): a `Host`.
        status: Makes the ``status`` command's answer.
        publish_snapshot: Sends a snapshot's JPEG somewhere (MQTT: the snapshot topic) and
            returns what the reply adds (``{"topic": ...}``); ``None``: the reply says where
            to fetch it (the web view's ``snapshot.jpg``).
    """

    def __init__(self, host: Host, *, status: Callable[[], dict[str, Any]],
                 publish_snapshot: Callable[[str, bytes], dict[str, Any]] | None = None) -> None:
        self.host = host
        self._status_message = status
        self._publish_snapshot = publish_snapshot

    def table(self) -> dict[str, Handler]:
        """Verb -> handler."""
        return {"status": self.status, "pause": self.pause, "resume": self.resume,
                "reload": self.reload, "snapshot": self.snapshot, "set": self.set,
                "reset": self.reset}

    def _names(self) -> list[str]:
        return [p.name for p in self.host.pipelines]

    def _pipeline(self, request: dict[str, Any]) -> Pipeline:
        name = pipeline_arg(request, self._names(), required=True)
        return next(p for p in self.host.pipelines if p.name == name)

    def status(self, request: dict[str, Any]) -> dict[str, Any]:
        no_other_args(request, "status")
        return self._status_message()

    def pause(self, request: dict[str, Any]) -> dict[str, Any]:
        name = pipeline_arg(request, self._names(), required=False)
        no_other_args(request, "pause")  # {"pipline": "x"} must not pause them all
        done = [p for p in self.host.pipelines if name in (None, p.name)]
        for p in done:
            p.pause()
        return {"paused": [p.name for p in done]}

    def resume(self, request: dict[str, Any]) -> dict[str, Any]:
        name = pipeline_arg(request, self._names(), required=False)
        no_other_args(request, "resume")
        done = [p for p in self.host.pipelines if name in (None, p.name)]
        for p in done:
            p.resume()
        return {"resumed": [p.name for p in done]}

    def reload(self, request: dict[str, Any]) -> dict[str, Any]:
        no_other_args(request, "reload")
        return self.host.reload()

    def snapshot(self, request: dict[str, Any]) -> dict[str, Any]:
        args = _convert(request, SnapshotArgs)
        pipeline = self._pipeline({"pipeline": args.pipeline})
        jpeg = snapshot_of(pipeline, args.event, args.quality)
        if self._publish_snapshot is None:
            return {"pipeline": pipeline.name, "bytes": len(jpeg)}
        return {**self._publish_snapshot(pipeline.name, jpeg), "bytes": len(jpeg)}

    def set(self, request: dict[str, Any]) -> dict[str, Any]:
        pipeline = self._pipeline(request)
        return {"pipeline": pipeline.name, "settings": pipeline.tune(request)}

    def reset(self, request: dict[str, Any]) -> dict[str, Any]:
        """Zero zone and line totals: ``{"pipeline": ..., "names": [...]}``, both optional
        (every pipeline with zones or lines; every zone and line)."""
        args = _convert(request, ResetArgs)
        with_scene = [(p.name, a) for p in self.host.pipelines
                      if (a := p.analytics) is not None and a.scene is not None]
        scened = with_scene
        if args.pipeline is not None:
            scened = [(name, a) for name, a in with_scene if name == args.pipeline]
            if not scened:
                raise CommandError(f"no pipeline {args.pipeline!r} with zones or lines; with "
                                   f"them: {', '.join(n for n, _ in with_scene) or 'none'}")
        elif not scened:
            raise CommandError("no pipeline has zones or lines")
        elif args.names is not None and len(scened) > 1:
            raise CommandError("give a pipeline with names: several pipelines have zones or "
                               "lines")
        done: dict[str, list[str]] = {}
        for name, analytics in scened:
            try:
                done[name] = analytics.reset(args.names)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        return {"reset": done}


def snapshot_of(pipeline: Pipeline, event: str | None = None, quality: int = 85) -> bytes:
    """The JPEG a ``snapshot`` asks for: the pipeline's latest frame annotated, or the stored
    snapshot of one of its events.

    Raises:
        CommandError: no image frame yet, or no such event snapshot.
    """
    if event is not None:
        jpeg = pipeline.analytics.event_snapshot(event) if pipeline.analytics else None
        if jpeg is None:
            raise CommandError(f"pipeline {pipeline.name!r} has no snapshot of event {event!r} "
                               "(unknown, not recorded, or deleted by retention)")
        return bytes(jpeg)
    try:
        return bytes(pipeline.snapshot_jpeg(quality))
    except StateError as exc:
        raise CommandError(str(exc)) from None


def _convert(request: dict[str, Any], struct: type[Any]) -> Any:
    try:
        return msgspec.convert(request, struct, strict=True)
    except msgspec.ValidationError as exc:
        raise CommandError(str(exc).replace("`$.", "`")) from None
