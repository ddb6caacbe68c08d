"""JSON from the network, decoded with one rule: whatever the bytes, a malformed document
raises ``msgspec.DecodeError`` (``ValidationError`` for a wrong shape), never anything else.

msgspec raises ``UnicodeDecodeError`` for a string holding bytes that are not UTF-8 (``{"a":
"\\xff"}``), which the ``except msgspec.DecodeError`` around every decode of a message let
through; an untrusted client on the broker could send one to any topic we read.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

import msgspec

__all__ = ["decode"]

T = TypeVar("T")


@overload
def decode(data: bytes | str, *, strict: bool = True) -> Any: ...
@overload
def decode(data: bytes | str, type: type[T], *, strict: bool = True) -> T: ...


def decode(data: bytes | str, type: Any = Any, *, strict: bool = True) -> Any:
    """``msgspec.json.decode`` with bytes that are not UTF-8 reported as a ``DecodeError``."""
    try:
        return msgspec.json.decode(data, type=type, strict=strict)
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(
            f"JSON is malformed: a string is not UTF-8 (byte {exc.start})") from None
