"""The topic names of one device, as ARCHITECTURE.md fixes them::

    <prefix>/<dev>/status                  retained birth / last will / stopped
    <prefix>/<dev>/<pipeline>/result       results (QoS 1)
    <prefix>/<dev>/<pipeline>/event        zone and line events (QoS 1, through the outbox)
    <prefix>/<dev>/<pipeline>/counts       retained zone occupancy and line counts
    <prefix>/<dev>/<pipeline>/snapshot     annotated JPEG on request
    <prefix>/<dev>/stats                   periodic stats
    <prefix>/<dev>/cmd/<verb>              commands in; replies on .../cmd/<verb>/reply

Replies live in the reply namespace: topics whose last level is ``reply``. ``reply`` is never a
command verb, so no reply (nor an MQTT 5 response topic a requester names) can be taken as a
command by any device, whatever its prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_RESPONSE_TOPIC_BYTES", "REPLY", "Topics", "check_filter", "check_level",
           "check_response_topic", "is_verb", "matches", "undotted"]

_FORBIDDEN = ("+", "#", "\x00", "\n")
_VERB = re.compile(r"[a-z0-9_-]{1,32}")
REPLY = "reply"  # the last level of every reply topic; never a verb
MAX_RESPONSE_TOPIC_BYTES = 1024


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

    def event(self, pipeline: str) -> str:
        """Scene analytics events of one pipeline (zones and lines)."""
        return f"{self.prefix}/{self.device}/{check_level(pipeline, 'pipeline')}/event"

    def counts(self, pipeline: str) -> str:
        """The retained zone occupancy and line counts of one pipeline."""
        return f"{self.prefix}/{self.device}/{check_level(pipeline, 'pipeline')}/counts"

    def snapshot(self, pipeline: str) -> str:
        """Annotated snapshots of one pipeline."""
        return f"{self.prefix}/{self.device}/{check_level(pipeline, 'pipeline')}/snapshot"

    def command(self, verb: str) -> str:
        """Where command ``verb`` arrives."""
        return f"{self.prefix}/{self.device}/cmd/{check_level(verb, 'command verb')}"

    def reply(self, verb: str) -> str:
        """Where replies to command ``verb`` go."""
        return f"{self.command(verb)}/{REPLY}"

    @property
    def invalid_reply(self) -> str:
        """Where a command whose verb is not a verb (see `is_verb`) is answered."""
        return f"{self.prefix}/{self.device}/cmd/invalid/{REPLY}"


def is_verb(value: str) -> bool:
    """Whether ``value`` can be a command verb: ``[a-z0-9_-]{1,32}``, and not ``reply``."""
    return value != REPLY and _VERB.fullmatch(value) is not None


def check_response_topic(value: object) -> str:
    """Return ``value`` if a reply may be published there: a topic name (no wildcard, NUL or
    ``$`` start, at most `MAX_RESPONSE_TOPIC_BYTES` of UTF-8) in the reply namespace (its last
    level is ``reply``).

    Raises:
        ValueError: why it may not.
    """
    if not isinstance(value, str) or not value:
        raise ValueError("the response topic must be a non-empty string")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("the response topic is not valid UTF-8") from None
    if size > MAX_RESPONSE_TOPIC_BYTES:
        raise ValueError(f"the response topic is {size} bytes, over {MAX_RESPONSE_TOPIC_BYTES}")
    bad = next((ch for ch in ("+", "#", "\x00") if ch in value), None)
    if bad is not None or value.startswith("$"):
        raise ValueError(f"the response topic {value[:80]!r} is not a topic one may publish to")
    if value.rsplit("/", 1)[-1] != REPLY:
        raise ValueError(f"the response topic {value[:80]!r} must end in /{REPLY} (the reply "
                         "namespace: never a command topic)")
    return value


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


def undotted(pattern: str, topic: str) -> str | None:
    """``topic`` as it was published, if a broker that takes ``.`` for a level separator
    (RabbitMQ's MQTT plugin: topics become AMQP routing keys) delivered it for ``pattern``
    (``a/cam.1/+`` gets ``a/cam/1/x``, published as ``a/cam.1/x``); None when it does not match
    that way either. The dots of ``pattern``'s own levels are restored; what a wildcard
    matched keeps the broker's spelling."""
    have = topic.split("/")
    out: list[str] = []
    for level in pattern.split("/"):
        if level == "#":
            return "/".join(out + have)
        width = 1 if level == "+" else level.count(".") + 1
        if len(have) < width or (level != "+" and ".".join(have[:width]) != level):
            return None
        out.append(".".join(have[:width]))
        have = have[width:]
    return None if have else "/".join(out)
