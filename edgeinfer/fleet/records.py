"""What the collector takes from the broker: device messages parsed into `Record`\\s, checked as
untrusted input (any client on the broker may publish under the devices' prefix).

Topics (``docs/mqtt.md``): ``<prefix>/<dev>/<pipeline>/result``, ``<prefix>/<dev>/<pipeline>/
event`` and the retained ``<prefix>/<dev>/status``. A message that is not one of those, is not
a JSON object, lacks its key fields, has them of the wrong type or size, or holds a value the
database cannot store (a number outside double precision's range, NUL) is *rejected*: it is
parked in the ``rejected`` table (a `Rejection`), acknowledged so the broker does not send it
again, and counted.

The keys that make writes idempotent: a result is ``(device, pipeline, run_id, seq)``, an event
```(device, pipeline, event_id)``, a status the device (the last received wins; the device's
``ts`` is kept as data, bounded to ``MAX_CLOCK_SKEW_S`` past the receive time).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["MAX_CLOCK_SKEW_S", "MAX_PAYLOAD", "REJECTED_KEEP", "Delivery", "Record", "Rejected",
           "Rejection", "bounded_status", "parse", "rejection", "source_of"]

MAX_PAYLOAD = 1024 * 1024  # a device's message is a few KiB; anything this big is not one
REJECTED_KEEP = 64 * 1024  # bytes of a rejected message's payload kept (and parked)
_MAX_NAME = 64
_MAX_ID = 128
_MAX_SEQ = 2**63 - 1
_MAX_DIGITS = 308  # an integer longer than this is beyond double precision (1.8e308)
_MAX_REASON = 500
_MAX_EXPONENT = 400
_MAX_FLOAT_TEXT = 100  # a double needs 24 characters; this leaves room for any other writer's
MAX_CLOCK_SKEW_S = 600.0
"""How far past its receive time a status's device ``ts`` may be; a later one is kept as the
receive time plus this (a clock far ahead must not look newer than everything to come)."""

Kind = Literal["result", "event", "status"]

# What PostgreSQL's jsonb cannot hold: a message with it would fail its whole batch, forever.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NONZERO_MANTISSA = re.compile(r"^-?[0.]*[1-9]")


class Rejected(ValueError):
    """A message that is not a device's result, event or status; the text says why."""


@dataclass(frozen=True, slots=True)
class Record:
    """One device message to write.

    Attributes:
        kind: ``result``, ``event`` or ``status``.
        device: The device id (the topic level).
        pipeline: The pipeline (``None`` for a status).
        run_id: The pipeline run (results and events; ``""`` when an older device sends none).
        seq: The result's seq (results), the event's seq (events; may be ``None``).
        event_id: The event's id (events).
        ts: The device's time of the message (Unix s): the result's or status's ``ts``, the
            event's ``start``; the receive time when the device gave none.
        received: When the collector received it (Unix s).
        payload: The message's JSON text, as the device sent it.
        topic: The topic it came on (to park it as rejected if the database refuses it).
    """

    kind: Kind
    device: str
    pipeline: str | None
    run_id: str
    seq: int | None
    event_id: str | None
    ts: float
    received: float
    payload: str
    topic: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    """A message that is not stored as a row: parked in the ``rejected`` table with why.

    Attributes:
        topic: The topic it came on (unstorable characters replaced).
        payload: Its body as received, the first ``REJECTED_KEEP`` bytes of it (a flood of
            big junk must not fill the collector's queue).
        reason: Why it was refused (the parser's or the database's words).
        received: When the collector received it (Unix s).
        size: The whole payload's size in bytes.
        source: Who sent it, as far as the collector can tell: the device level of its topic
            (`source_of`); the ``rejected`` table's caps are per source.
    """

    topic: str
    payload: bytes
    reason: str
    received: float
    size: int
    source: str = ""


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message as a source hands it to the collector: the parsed record (``None``: rejected,
    parked and acknowledged without a row; ``rejection`` then says why, unless nothing need be
    kept), the source's acknowledgement token, and whether the broker said it may have been
    delivered before."""

    record: Record | None
    token: Any
    redelivered: bool = False
    rejection: Rejection | None = None


def rejection(topic: str, payload: bytes, exc: BaseException, received: float,
              source: str = "") -> Rejection:
    """The `Rejection` of a message ``parse`` (or anything after it) refused with ``exc``:
    a `Rejected` gives its text, any other exception its type and text."""
    reason = str(exc) if isinstance(exc, Rejected) else f"{type(exc).__name__}: {exc}"
    return Rejection(_UNSTORABLE.sub("\ufffd", topic), bytes(payload[:REJECTED_KEEP]),
                     _UNSTORABLE.sub("\ufffd", reason)[:_MAX_REASON], received, len(payload),
                     _UNSTORABLE.sub("\ufffd", source)[:_MAX_NAME])


def source_of(topic: str, prefix: str) -> str:
    """Who sent a message on ``topic``, as far as a subscriber can tell: the level after the
    prefix (a device id, or what a client publishing junk put there); ``(outside the prefix)``
    or ``(empty)`` otherwise. MQTT does not tell a subscriber the publisher's client id."""
    if not topic.startswith(prefix + "/"):
        return "(outside the prefix)"
    return topic[len(prefix) + 1:].split("/", 1)[0][:_MAX_NAME] or "(empty)"


# Kept first when a status is summarised: what `edgeinfer fleet` and dashboards read.
_STATUS_FIRST = ("state", "device", "version", "ts", "problem", "pipelines", "failed")


def bounded_status(payload: str, limit: int) -> str | None:
    """A status's JSON at most ``limit`` bytes long: ``None`` when it is already, else a
    summary: its top-level fields that fit (``state``, ``device``, ``version``, ``ts``, ...
    first), and ``_truncated``: ``{"size", "limit", "dropped": [field names]}``."""
    if len(payload.encode("utf-8")) <= limit:
        return None
    size = len(payload.encode("utf-8"))
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        doc = None
    fields = doc if isinstance(doc, dict) else {}
    order = [k for k in _STATUS_FIRST if k in fields] + [k for k in fields
                                                         if k not in _STATUS_FIRST]
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    budget = limit - 200  # room for _truncated and its first names
    for key in order:
        part = len(json.dumps({key: fields[key]}).encode("utf-8"))
        if part < budget:
            kept[key] = fields[key]
            budget -= part
        else:
            dropped.append(key)
    note: dict[str, Any] = {"size": size, "limit": limit, "dropped": []}
    for key in dropped:  # names as long as they fit; the count says the rest
        if len(json.dumps({**kept, "_truncated": note}).encode("utf-8")) + len(key) + 8 > limit:
            break
        note["dropped"].append(key)
    note["dropped_fields"] = len(dropped)
    return json.dumps({**kept, "_truncated": note})


def parse(topic: str, payload: bytes, prefix: str, received: float) -> Record:
    """The record of one message on ``topic``.

    Args:
        topic: The MQTT topic (``/`` separated; a NATS subject is converted by its source).
        payload: The message body.
        prefix: The devices' topic prefix (``edgeinfer``).
        received: The receive time (Unix s).

    Raises:
        Rejected: not a device message edgeinfer makes, or malformed.
    """
    kind, device, pipeline = _topic(topic, prefix)
    if len(payload) > MAX_PAYLOAD:
        raise Rejected(f"payload of {len(payload)} bytes is over {MAX_PAYLOAD}")
    try:
        text = payload.decode("utf-8")
        doc = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except Rejected:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Rejected(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(doc, dict):
        raise Rejected("not a JSON object")
    if "\\u" in text:
        _storable(doc)
    if kind == "status":
        ts = min(_ts(doc.get("ts"), received), received + MAX_CLOCK_SKEW_S)
        return Record("status", device, None, "", None, None, ts, received, text, topic)
    run_id = _text(doc.get("run_id", ""), "run_id", _MAX_ID, allow_empty=True)
    if kind == "result":
        seq = _seq(doc.get("seq"))
        return Record("result", device, pipeline, run_id, seq, None,
                      _ts(doc.get("ts"), received), received, text, topic)
    event_id = _text(doc.get("event_id"), "event_id", _MAX_ID)
    seq_value = doc.get("seq")
    return Record("event", device, pipeline, run_id,
                  _seq(seq_value) if seq_value is not None else None, event_id,
                  _ts(doc.get("start", doc.get("ts")), received), received, text, topic)


def _constant(name: str) -> Any:
    raise Rejected(f"not JSON: {name}")


# Every number stored must convert to double precision: the results_flat view and dashboards
# cast them, and PostgreSQL's numeric refuses exponents past +-16383 outright.
def _float(text: str) -> float:
    if len(text) > _MAX_FLOAT_TEXT:  # numeric keeps at most 16383 digits after the point
        raise Rejected(f"a number of {len(text)} characters: {text[:40]}...")
    value = float(text)
    if not math.isfinite(value):
        raise Rejected(f"a number out of range: {text[:40]}")
    if value == 0.0:  # (only then can the text hide what float() rounded away)
        if _NONZERO_MANTISSA.match(text):
            raise Rejected(f"a number too small for double precision: {text[:40]}")
        _, e, exponent = text.lower().partition("e")
        if e and abs(int(exponent)) > _MAX_EXPONENT:  # even 0e-20000 overflows numeric
            raise Rejected(f"a number out of range: {text[:40]}")
    return value


def _int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_DIGITS:
        raise Rejected(f"an integer of {len(text)} digits: out of range")
    return int(text)


def _storable(doc: Any) -> None:
    # Only an escape can put NUL or a lone surrogate in decoded JSON; iterative, as deep
    # documents are allowed up to json's own limit.
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                raise Rejected("a string with NUL or an unpaired surrogate")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _topic(topic: str, prefix: str) -> tuple[Kind, str, str | None]:
    if not topic.startswith(prefix + "/"):
        raise Rejected(f"topic outside the prefix {prefix!r}")
    levels = topic[len(prefix) + 1:].split("/")
    if len(levels) == 2 and levels[1] == "status":
        return "status", _name(levels[0], "device"), None
    if len(levels) == 3 and levels[2] in ("result", "event"):
        kind: Kind = "result" if levels[2] == "result" else "event"
        return kind, _name(levels[0], "device"), _name(levels[1], "pipeline")
    raise Rejected("not a result, event or status topic")


def _name(value: str, what: str) -> str:
    if not value or len(value) > _MAX_NAME or not value.isprintable():
        raise Rejected(f"invalid {what} topic level")
    return value


def _text(value: Any, what: str, limit: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or len(value) > limit or (not value and not allow_empty) \
            or not value.isprintable():
        raise Rejected(f"{what}: expected a printable string of at most {limit} characters")
    return value


def _seq(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_SEQ:
        raise Rejected("seq: expected an integer from 0 to 2**63-1")
    return value


def _ts(value: Any, fallback: float) -> float:
    # A device clock may be wrong; a value that is not a plausible Unix time is not stored as one.
    # (compared before any float conversion: a huge int would raise OverflowError)
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 0 < value < 4_102_444_800:  # before 2100 (NaN fails the comparison)
        return float(value)
    return fallback
