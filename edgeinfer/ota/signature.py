"""What every signed OTA message shares: the manifest, the rollback request, and the signed
commands of `edgeinfer.control.signed` (``docs/ota.md``).

A signature is Ed25519 over ``DOMAIN + text``, where ``text`` is the exact UTF-8 JSON text that
travels: a device verifies those bytes before it trusts any field (``verify_bytes``), reading
only the key id first (``signed_key_id``). A request id (``request_id``) names one signed text
with its signature; every status answering it carries that id. Times are ISO-8601 UTC.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from ..errors import OtaRejected
from ..keys import PrivateKey, PublicKey

__all__ = ["DOMAIN", "encode", "now_iso", "parse_time", "request_id", "sign_bytes",
           "signed_key_id", "verify_bytes"]

DOMAIN = b"edgeinfer-ota/2\n"


def sign_bytes(data: bytes, key: PrivateKey) -> str:
    """The base64 Ed25519 signature of ``DOMAIN + data``."""
    return base64.b64encode(key.sign(DOMAIN + data)).decode("ascii")



def verify_bytes(
    data: bytes,
    signature: str | None,
    key_id: str | None,
    trusted: Mapping[str, PublicKey],
    *,
    allow_unsigned: bool,
) -> None:
    """Check the signature of ``data``; a signed payload is always checked.

    Raises:
        OtaRejected: ``unsigned`` (no signature and ``allow_unsigned`` off), ``unknown_key``
            (signed by a key not in ``trusted``, or no key id), ``bad_signature`` (not base64,
            or it does not verify).
    """
    if signature is None:
        if allow_unsigned:
            return
        raise OtaRejected("unsigned", "the update is not signed and ota.allow_unsigned is off")
    key = trusted.get(key_id) if key_id is not None else None
    if key is None:
        raise OtaRejected("unknown_key", f"signed by key {key_id!r}, which this device does not trust"
                          if key_id is not None else "signed, but no key_id says by which key")
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise OtaRejected("bad_signature", "the signature is not valid base64") from None
    if not key.verify(DOMAIN + data, raw):
        raise OtaRejected("bad_signature", f"the signature does not verify with key {key_id}")



def signed_key_id(text: str, what: str) -> str | None:
    """The ``key_id`` of a JSON object text (a manifest, a rollback request), read before
    anything in it is trusted; ``None`` when it names none. ``what`` names the text in errors.

    Raises:
        OtaRejected: ``bad_manifest``, the text is not a JSON object.
    """
    try:
        obj = msgspec.json.decode(text.encode("utf-8", "surrogatepass"))
    except msgspec.DecodeError as exc:
        raise OtaRejected("bad_manifest", f"the {what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise OtaRejected("bad_manifest", f"the {what} is not a JSON object")
    kid = obj.get("key_id")
    return kid if isinstance(kid, str) else None



def request_id(text: str, signature: str | None) -> str:
    """The id of one signed request (an offer's manifest, a rollback request): 16 hex digits of
    the sha256 of its text and signature. Statuses answering it carry it; a copy with another
    signature (a forgery) has another id, so it cannot speak for the real one."""
    h = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    h.update(b"\n" + (signature or "").encode("ascii", "replace"))
    return h.hexdigest()[:16]



def encode(struct: Any) -> bytes:
    """The JSON bytes of a message (``msgspec.json.encode``)."""
    return msgspec.json.encode(struct)



def now_iso(ts: float | None = None) -> str:
    """``ts`` (default now) as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if ts is None else ts))



def parse_time(value: str) -> float:
    """An ISO-8601 time as a Unix timestamp (no zone: UTC); ``ValueError`` if it is not one."""
    if not value or len(value) > 64:
        raise ValueError(f"not an ISO-8601 time: {value[:80]!r}")
    dt = datetime.fromisoformat(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()
