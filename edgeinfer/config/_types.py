"""The value types of the config tree: every number with a finite range, every name a pattern.

The ranges live on the types (``msgspec.Meta``), so that ``msgspec.convert`` enforces them
wherever a struct is built from data: the YAML loader, and runtime commands that change a
setting. A bound also keeps ``inf`` and ``nan`` out (msgspec compares, and neither passes both
ends of a range). A new numeric field takes one of these aliases or a ``Meta`` with a lower and
an upper bound; ``tests/config/test_ranges.py`` fails for a number without both.

Patterns end in ``(?![\\s\\S])`` rather than ``$``: msgspec matches with ``re.search``, where
``$`` also matches before a final newline, and that newline would reach an MQTT topic.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

__all__ = [
    "ConfigStruct",
    "DAY",
    "PATTERN_HELP",
    "Arg",
    "ClientId",
    "DeviceId",
    "Dim",
    "FilePath",
    "Fps",
    "Fraction",
    "GroupName",
    "Host",
    "Interval",
    "MiB",
    "Milliseconds",
    "PipelineName",
    "Port",
    "Readings",
    "Samples",
    "Seconds",
    "Size",
    "Text",
    "Threads",
    "TopicFilter",
    "TopicPath",
]

DAY = 86_400.0
_END = r"(?![\s\S])"  # the very end of the string: no final newline slips through
_CONTROL = r"\x00-\x1f\x7f"

# --- numbers ------------------------------------------------------------------------------------

Seconds = Annotated[float, Meta(ge=0.01, le=DAY)]
"""A timeout, a backoff or a period: 10 ms to a day."""
Interval = Annotated[float, Meta(ge=0, le=DAY)]
"""A minimum spacing where 0 means none: 0 to a day."""
Milliseconds = Annotated[float, Meta(ge=0, le=600_000)]
"""A debounce time: 0 to 10 minutes."""
Fps = Annotated[float, Meta(ge=0.01, le=1000)]
"""Frames per second: one frame in 100 s to 1000 a second."""
MiB = Annotated[float, Meta(ge=0.01, le=1_048_576)]
"""A size in MiB: 10 KiB to 1 TiB."""
Port = Annotated[int, Meta(ge=1, le=65535)]
Threads = Annotated[int, Meta(ge=1, le=64)]
Size = Annotated[int, Meta(ge=1, le=16384)]
"""Pixels of an image side."""
Dim = Annotated[int, Meta(ge=1, le=16_777_216)]
"""One dimension of a tensor shape."""
Samples = Annotated[int, Meta(ge=1, le=4_194_304)]
"""Audio samples per channel (about 4 minutes at 16 kHz)."""
Readings = Annotated[int, Meta(ge=1, le=100_000)]
"""Sensor readings (lines or messages)."""
Fraction = Annotated[float, Meta(ge=0, le=1)]

# --- names --------------------------------------------------------------------------------------

_PRINTABLE = rf"^[^{_CONTROL}]*{_END}"
_NO_NUL = r"^[^\x00]*$"  # the OS takes no NUL in a path or an argument
_HOST = rf"^[^\s{_CONTROL}]+{_END}"
_PIPELINE_NAME = rf"^[A-Za-z0-9_-]{{1,64}}{_END}"
# One topic level that is also a safe file name: not "." or "..".
_SAFE_LEVEL = rf"^(?!\.\.?{_END})[A-Za-z0-9_.-]{{1,64}}{_END}"
# A device id: such a level that is not one of the levels the topic layout gives a meaning of
# its own beside device ids (<prefix>/group/<group>/ota/..., <prefix>/reply/... for MQTT 5
# response topics): a device so named would share its topics with those.
_DEVICE_ID = rf"^(?!(?:\.\.?|group|reply){_END})[A-Za-z0-9_.-]{{1,64}}{_END}"
# Topic levels joined by "/": none empty, no wildcard, not starting with "$" (broker topics).
_LEVEL = rf"[^#+/{_CONTROL}]+"
_TOPIC_PATH = rf"^(?!\$){_LEVEL}(?:/{_LEVEL})*{_END}"

FilePath = Annotated[str, Meta(pattern=_NO_NUL, min_length=1)]
"""A file or device path (a relative one is made absolute: "" would name a folder)."""
Arg = Annotated[str, Meta(pattern=_NO_NUL)]
"""A command argument, a stream URL or a GStreamer pipeline."""
Text = Annotated[str, Meta(pattern=_PRINTABLE, max_length=65535)]
"""A string without control characters (MQTT strings must not hold NUL)."""
ClientId = Annotated[str, Meta(pattern=_PRINTABLE, min_length=1, max_length=128)]
Host = Annotated[str, Meta(pattern=_HOST, max_length=253)]
PipelineName = Annotated[str, Meta(pattern=_PIPELINE_NAME)]
DeviceId = Annotated[str, Meta(pattern=_DEVICE_ID)]
GroupName = Annotated[str, Meta(pattern=_SAFE_LEVEL)]
TopicPath = Annotated[str, Meta(pattern=_TOPIC_PATH, max_length=256)]
"""Topic levels to publish under, e.g. ``edgeinfer`` or ``site/a``."""
TopicFilter = Annotated[str, Meta(pattern=_PRINTABLE, min_length=1, max_length=65535)]
"""A topic to subscribe to; wildcards allowed."""

PATTERN_HELP = {
    _PRINTABLE: "str without control characters",
    _NO_NUL: "str without NUL characters",
    _HOST: "a host name or address (no spaces or control characters)",
    _PIPELINE_NAME: "a name of 1 to 64 characters A-Z a-z 0-9 _ -",
    _SAFE_LEVEL: "a name of 1 to 64 characters A-Z a-z 0-9 _ . -, not '.' or '..'",
    _DEVICE_ID: "a name of 1 to 64 characters A-Z a-z 0-9 _ . -, not '.', '..', 'group' or "
                "'reply' (topic levels of their own)",
    _TOPIC_PATH: "MQTT topic levels joined by '/' (no empty level, no '+' or '#', "
                 "no control characters, not starting with '$')",
}
"""What each pattern asks for, in words, for error messages (by pattern)."""


class ConfigStruct(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The base of every config struct: unknown keys refused, keyword-only, immutable.

    A subclass repeats ``frozen=True``: msgspec inherits it, but mypy's dataclass_transform
    reads it per class (without it: "Non-frozen dataclass cannot inherit from a frozen one")."""


class TaggedPart(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True,
                 tag_field="type"):
    """Shared options of every tagged part (source, task, sink): picked by its ``type:``.

    ``needs_sections`` names the top-level sections a part cannot work without (an ``mqtt``
    sink: ``("mqtt",)``); ``validate-config`` and ``run`` refuse it when one is missing."""

    needs_sections: ClassVar[tuple[str, ...]] = ()
