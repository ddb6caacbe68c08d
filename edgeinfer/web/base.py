"""What the route modules of the web server share: the `Refused` answer a handler raises and
the JSON encoding of their answers. The daemon they serve is a `Host` (``edgeinfer.host``), as
for the rest of the control plane."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Refused", "dumps"]


class Refused(Exception):
    """A request answered with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def dumps(data: Any) -> str:
    """``data`` as JSON; values JSON has no type for (paths, datetimes) as their ``str``."""
    return json.dumps(data, default=str)
