"""The OTA wire protocol's shared parts: topic names, the status message, chunk ranges.

Both sides use these: the device's receiver publishes ``OtaStatus`` on its status topic, and
``push-model`` reads it to resend missing chunks and report the outcome (``docs/ota.md``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import msgspec

from .. import _json
from ..mqtt.topics import check_level

__all__ = [
    "FINAL_STATES",
    "MAX_CHUNK",
    "MAX_OFFER_BYTES",
    "MAX_RANGES",
    "MIN_CHUNK",
    "SCHEMA",
    "OtaStatus",
    "State",
    "base_topic",
    "chunk_topic",
    "expand_ranges",
    "offer_topic",
    "parse_chunk_topic",
    "rollback_topic",
    "status_topic",
    "to_ranges",
]

SCHEMA = "edgeinfer-ota/2"
MIN_CHUNK = 64 * 1024
MAX_CHUNK = 512 * 1024
MAX_OFFER_BYTES = 8 * 1024 * 1024
MAX_RANGES = 64

State = Literal["receiving", "verifying", "rejected", "applied", "committed", "rolled_back"]
FINAL_STATES = frozenset({"rejected", "committed", "rolled_back"})


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str | None = None
    version: str | None = None
    sha256: str | None = None


class OtaStatus(msgspec.Struct, kw_only=True, omit_defaults=False):
    """What ``<prefix>/<device>/ota/status`` carries (retained). ``request`` is the id of
    the offer or rollback request it answers (``manifest.request_id``): a pusher takes only
    statuses that carry its own."""

    device: str
    state: State
    request: str | None = None
    transfer: str | None = None
    pipeline: str | None = None
    name: str | None = None
    version: str | None = None
    sha256: str | None = None
    group: str | None = None
    reason: str | None = None
    message: str | None = None
    received: int = 0
    chunks: int = 0
    missing: list[list[int]] = []
    previous: ModelInfo | None = None
    ts: float = 0.0

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, payload: bytes) -> OtaStatus:
        """Raises ``msgspec.ValidationError``/``DecodeError`` for a malformed payload."""
        return _json.decode(payload, type=cls)


# -- topics ----------------------------------------------------------------------------------
def base_topic(prefix: str, *, device: str | None = None, group: str | None = None) -> str:
    """``<prefix>/<device>`` or ``<prefix>/group/<group>``: where offers, chunks and rollback
    requests for that target go."""
    if (device is None) == (group is None):
        raise ValueError("name exactly one of device and group")
    if group is not None:
        return f"{prefix}/group/{check_level(group, 'group')}"
    return f"{prefix}/{check_level(device or '', 'device id')}"


def offer_topic(base: str) -> str:
    return f"{base}/ota/offer"


def rollback_topic(base: str) -> str:
    return f"{base}/ota/rollback"


def chunk_topic(base: str, transfer: str, index: int) -> str:
    return f"{base}/ota/chunk/{transfer}/{index}"


def status_topic(prefix: str, device: str) -> str:
    return f"{prefix}/{check_level(device, 'device id')}/ota/status"


def parse_chunk_topic(topic: str) -> tuple[str, int] | None:
    """``(transfer, index)`` of a chunk topic, or None when it is not one."""
    parts = topic.rsplit("/", 4)
    if len(parts) != 5 or parts[1] != "ota" or parts[2] != "chunk":
        return None
    try:
        index = int(parts[4])
    except ValueError:
        return None
    return (parts[3], index) if index >= 0 and parts[4].isdigit() else None


# -- chunk ranges ----------------------------------------------------------------------------
def to_ranges(indices: Iterable[int], limit: int = MAX_RANGES) -> list[list[int]]:
    """Sorted indices as inclusive ``[first, last]`` ranges; past ``limit`` ranges the last one
    is stretched to the last index (so a resend covers everything still missing)."""
    ranges: list[list[int]] = []
    for i in sorted(indices):
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    if len(ranges) > limit:
        ranges = ranges[:limit - 1] + [[ranges[limit - 1][0], ranges[-1][1]]]
    return ranges


def expand_ranges(ranges: Iterable[Iterable[Any]], count: int) -> Iterator[int]:
    """The indices in inclusive ranges, clipped to ``[0, count)``; malformed ranges skipped."""
    seen: set[int] = set()
    for r in ranges:
        try:
            first, last = (int(v) for v in r)
        except (TypeError, ValueError):
            continue
        for i in range(max(first, 0), min(last, count - 1) + 1):
            if i not in seen:
                seen.add(i)
                yield i
