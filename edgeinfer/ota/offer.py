"""The offer message as it travels (``docs/ota.md``): the manifest's text as signed, its
signature, the transfer section (how the file is cut into chunks: not signed, so a device takes
it only when it repeats the signed manifest's) and the golden file. ``parse_offer`` checks its
shape before anything in it is trusted; ``manifest.open_offer`` then verifies and decodes it.
"""

from __future__ import annotations

import base64
import binascii
import re

import msgspec

from .. import _json
from ..errors import OtaRejected
from . import protocol

__all__ = ["Offer", "TransferInfo", "golden_bytes", "parse_offer"]

_HEX16 = re.compile(r"[0-9a-f]{16}")


class TransferInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the model file is cut into chunks: ``id`` (16 hex), ``chunk_size``, ``chunks``.
    Not signed: a device takes it only when it equals the signed manifest's."""

    id: str
    chunk_size: int
    chunks: int


class Offer(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The offer message: the manifest text as sent, its signature, the transfer, the golden
    file (base64)."""

    manifest: str
    signature: str | None = None
    transfer: TransferInfo
    golden: str | None = None


def parse_offer(payload: bytes) -> Offer:
    """Decode an offer message and check its transfer section's shape.

    Raises:
        OtaRejected: ``bad_transfer`` for an offer over ``MAX_OFFER_BYTES`` or a malformed
            transfer section (``id`` not 16 hex, ``chunk_size`` out of range, ``chunks`` < 1);
            ``bad_manifest`` for bad JSON, wrong types or unknown fields elsewhere.
    """
    if len(payload) > protocol.MAX_OFFER_BYTES:
        raise OtaRejected("bad_transfer", f"the offer is {len(payload)} bytes, over "
                                          f"{protocol.MAX_OFFER_BYTES}")
    try:
        offer = _json.decode(payload, type=Offer)
    except msgspec.ValidationError as exc:
        reason = "bad_transfer" if "$.transfer" in str(exc) else "bad_manifest"
        raise OtaRejected(reason, f"malformed offer: {exc}") from None
    except msgspec.DecodeError as exc:
        raise OtaRejected("bad_manifest", f"the offer is not valid JSON: {exc}") from None
    t = offer.transfer
    if not _HEX16.fullmatch(t.id):
        raise OtaRejected("bad_transfer", f"transfer id must be 16 lowercase hex digits, got {t.id[:40]!r}")
    if not protocol.MIN_CHUNK <= t.chunk_size <= protocol.MAX_CHUNK:
        raise OtaRejected("bad_transfer", f"chunk size {t.chunk_size} is outside "
                                          f"{protocol.MIN_CHUNK}..{protocol.MAX_CHUNK}")
    if t.chunks < 1:
        raise OtaRejected("bad_transfer", f"chunk count must be >= 1, got {t.chunks}")
    return offer


def golden_bytes(offer: Offer) -> bytes | None:
    """The golden ``.npz`` bytes an offer carries, or None.

    Raises:
        OtaRejected: ``bad_manifest`` when it is not base64.
    """
    if offer.golden is None:
        return None
    try:
        return base64.b64decode(offer.golden, validate=True)
    except (binascii.Error, ValueError):
        raise OtaRejected("bad_manifest", "the offer's golden file is not valid base64") from None
