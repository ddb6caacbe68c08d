"""The topic names of one device, as ARCHITECTURE.md fixes them::

    <prefix>/<dev>/status                  retained birth / last will / stopped
    <prefix>/<dev>/<pipeline>/result       results (QoS 1)
    <prefix>/<dev>/<pipeline>/snapshot     annotated JPEG on request
    <prefix>/<dev>/stats                   periodic stats
    <prefix>/<dev>/cmd/<verb>              commands in; replies on .../cmd/<verb>/reply
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Topics", "check_filter", "check_level", "matches"]

_FORBIDDEN = ("+", "#", "\x00", "\n")


def check_level(value: str, what: str, *, multi: bool = False) -> str:
    """Return ``value`` if it can stand as one topic level (``multi``: as several, ``a/b``).

    Raises:
        ValueError: empty, a wildcard, NUL or newline, a ``/`` where one level is expected, or
            an empty level.
    """
    if not value:
        raise ValueError(f"{what} must not be empty (it becomes an MQTT topic level)")
    for ch in _FORBIDDEN:
        if ch in value:
            raise ValueError(f"{what} {value!r} must not contain {ch!r} (an MQTT topic level)")
    if "/" in value and not multi:
        raise ValueError(f"{what} {value!r} must not contain '/' (one MQTT topic level)")
    if multi and "" in value.split("/"):
        raise ValueError(f"{what} {value!r} has an empty topic level")
    return value


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names under ``<prefix>/<device>``.

    Attributes:
        prefix: First level(s); may hold ``/`` (``site/edge``), never wildcards.
        device: The device id, one level.
    """

    prefix: str
    device: str

    def __post_init__(self) -> None:
        check_level(self.prefix, "prefix", multi=True)
        check_level(self.device, "device id")

    @property
    def base(self) -> str:
        """``<prefix>/<device>``."""
        return f"{self.prefix}/{self.device}"

    @property
    def status(self) -> str:
        """Retained ``online`` birth, ``offline`` last will, ``stopped`` on a clean stop."""
        return f"{self.prefix}/{self.device}/status"

    @property
    def stats(self) -> str:
        """Periodic stats of the device."""
        return f"{self.prefix}/{self.device}/stats"

    @property
    def commands(self) -> str:
        """The filter every command arrives on: ``<prefix>/<dev>/cmd/+``."""
        return f"{self.prefix}/{self.device}/cmd/+"

    def result(self, pipeline: str) -> str:
        """Results of one pipeline."""
        return f"{self.prefix}/{self.device}/{check_level(pipeline, 'pipeline')}/result"

    def snapshot(self, pipeline: str) -> str:
        """Annotated snapshots of one pipeline."""
        return f"{self.prefix}/{self.device}/{check_level(pipeline, 'pipeline')}/snapshot"

    def command(self, verb: str) -> str:
        """Where command ``verb`` arrives."""
        return f"{self.prefix}/{self.device}/cmd/{check_level(verb, 'command verb')}"

    def reply(self, verb: str) -> str:
        """Where replies to command ``verb`` go."""
        return f"{self.command(verb)}/reply"


def check_filter(value: str) -> str:
    """Return ``value`` if it is a valid subscription filter (``+`` a whole level, ``#`` last).

    Raises:
        ValueError: an empty filter, or a wildcard inside a level or ``#`` before the end.
    """
    if not value or "\x00" in value:
        raise ValueError(f"invalid MQTT topic filter {value!r}")
    levels = value.split("/")
    for i, level in enumerate(levels):
        if ("+" in level or "#" in level) and len(level) != 1:
            raise ValueError(f"invalid MQTT topic filter {value!r}: a wildcard must be a whole level")
        if level == "#" and i != len(levels) - 1:
            raise ValueError(f"invalid MQTT topic filter {value!r}: '#' must be the last level")
    return value


def matches(pattern: str, topic: str) -> bool:
    """Whether ``topic`` matches subscription filter ``pattern`` (MQTT rules, ``$`` topics too)."""
    if pattern == topic:
        return True
    if "+" not in pattern and "#" not in pattern:
        return False
    if topic.startswith("$") and pattern[0] in "+#":
        return False  # wildcards at the first level never match $SYS and the like
    want, have = pattern.split("/"), topic.split("/")
    for i, level in enumerate(want):
        if level == "#":
            return True
        if i >= len(have) or (level != "+" and level != have[i]):
            return False
    return len(want) == len(have)
