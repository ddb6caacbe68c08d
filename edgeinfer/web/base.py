"""What the route modules of the web server share: the host they serve (`WebHost`), the
`Refused` answer a handler raises, and the JSON encoding of their answers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["Refused", "WebHost", "dumps"]


class WebHost(Protocol):
    """What the web server shows and acts on (the daemon)."""

    @property
    def pipelines(self) -> list[Pipeline]: ...

    @property
    def device_id(self) -> str: ...

    def status(self) -> dict[str, Any]: ...

    def command(self, verb: str, request: dict[str, Any]) -> dict[str, Any]: ...


class Refused(Exception):
    """A request answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def dumps(data: Any) -> str:
    """``data`` as JSON; values JSON has no type for (paths, datetimes) as their ``str``."""
    return json.dumps(data, default=str)
