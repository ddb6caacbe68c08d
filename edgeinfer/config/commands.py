"""Typed config of ``mqtt.commands``: which command verbs a device answers, which of them must
be signed, and the arguments of the commands that take more than a pipeline name. Field names
are a contract (``docs/mqtt.md#commands``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ._types import ConfigStruct, DAY, PipelineName
from .analytics import AnalyticsNameStr

__all__ = ["VERBS", "CommandsConfig", "ResetArgs", "SnapshotArgs", "Verb"]

Verb = Literal["status", "pause", "resume", "reload", "snapshot", "set", "reset"]
VERBS: tuple[str, ...] = ("status", "pause", "resume", "reload", "snapshot", "set", "reset")


class CommandsConfig(ConfigStruct, frozen=True):
    """The command policy of a device (``mqtt.commands: {...}``; ``true`` is all defaults,
    ``false`` answers no command).

    Attributes:
        allow: Verbs the device answers; any other gets an error reply and is not run.
        signed: Verbs (also in ``allow``) that run only when signed with a key of
            ``ota.trusted_keys``, for this device and verb, within ``max_age_s``, with a
            nonce never used before (remembered in the state directory across restarts).
        max_age_s: A signed command created longer ago than this is refused.
    """

    allow: list[Verb] = msgspec.field(default_factory=lambda: list(VERBS))  # type: ignore[arg-type]
    signed: list[Verb] = []
    max_age_s: Annotated[float, Meta(ge=1, le=DAY)] = 300.0

    def __post_init__(self) -> None:
        loose = [v for v in self.signed if v not in self.allow]
        if loose:
            raise ValueError(f"signed verbs must also be in allow: {', '.join(loose)}")


class SnapshotArgs(ConfigStruct, frozen=True):
    """The arguments of the ``snapshot`` command.

    Attributes:
        pipeline: Which pipeline (may be left out when the daemon runs one).
        quality: JPEG quality.
        event: An event id: the event's stored annotated snapshot instead of the latest frame.
    """

    pipeline: PipelineName | None = None
    quality: Annotated[int, Meta(ge=1, le=100)] = 85
    event: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,128}(?![\s\S])")] | None = None


class ResetArgs(ConfigStruct, frozen=True):
    """The arguments of the ``reset`` command (zero zone and line totals).

    Attributes:
        pipeline: Which pipeline (``None``: every pipeline with zones or lines).
        names: Which zones and lines (``None``: all of the pipeline's).
    """

    pipeline: PipelineName | None = None
    names: Annotated[list[AnalyticsNameStr], Meta(min_length=1, max_length=128)] | None = None
