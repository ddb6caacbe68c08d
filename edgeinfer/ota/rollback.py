"""The signed rollback request: put a pipeline back on its previous model (``docs/ota.md``).

Signed like a manifest (``signature.sign_bytes`` over the exact request text), bound to its
target, valid for 15 minutes, its nonce taken once (``replay.ReplayGuard``, across restarts).
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import msgspec

from .. import _json
from ..errors import OtaRejected
from .manifest import FUTURE_SKEW_S, PIPELINE_NAME, Target
from .signature import (
    encode,
    now_iso,
    parse_time,
    request_id,
    sign_bytes,
    signed_key_id,
    verify_bytes,
)

if TYPE_CHECKING:
    from ..keys import PrivateKey, PublicKey

__all__ = ["RollbackRequest", "make_rollback", "open_rollback", "parse_rollback"]

_NONCE = re.compile(r"[0-9a-f]{8,64}")
_MAX_ROLLBACK_BYTES = 64 * 1024


class RollbackRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A signed request to put a pipeline back on its previous model."""

    schema: Literal["edgeinfer-ota/2"] = "edgeinfer-ota/2"
    action: Literal["rollback"] = "rollback"
    pipeline: str
    target: Target
    created: str
    nonce: str
    key_id: str | None = None


class _RollbackEnvelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    request: str
    signature: str | None = None


def make_rollback(pipeline: str, key: PrivateKey | None, *, target: Target) -> bytes:
    """A rollback request for ``pipeline`` on ``target``, created now with a random nonce,
    signed with ``key`` (None: unsigned).

    Raises:
        ValueError: ``pipeline`` is not a valid pipeline name.
    """
    if not PIPELINE_NAME.fullmatch(pipeline):
        raise ValueError(f"pipeline {pipeline!r} must match [A-Za-z0-9_-]{{1,64}}")
    text = encode(RollbackRequest(pipeline=pipeline, target=target, created=now_iso(),
                                  nonce=secrets.token_hex(8),
                                  key_id=key.key_id if key is not None else None))
    return encode(_RollbackEnvelope(
        request=text.decode("utf-8"),
        signature=sign_bytes(text, key) if key is not None else None,
    ))


def open_rollback(
    payload: bytes,
    trusted: Mapping[str, PublicKey],
    *,
    allow_unsigned: bool,
    max_age_s: float = 900,
    now: float | None = None,
) -> tuple[RollbackRequest, str]:
    """Verify and decode a rollback request; the caller checks its target and its nonce
    (``replay.ReplayGuard``).

    Args:
        payload: the message.
        trusted: the device's trusted keys.
        allow_unsigned: accept an unsigned request.
        max_age_s: refuse requests created longer ago than this.
        now: the current Unix time (default ``time.time()``).

    Returns:
        The request and its request id.

    Raises:
        OtaRejected: the ``verify_bytes`` reasons; ``bad_manifest`` for a malformed, stale
            or (more than 60 s) future request.
    """
    if len(payload) > _MAX_ROLLBACK_BYTES:
        raise OtaRejected("bad_manifest", f"the rollback request is {len(payload)} bytes, over "
                                          f"{_MAX_ROLLBACK_BYTES}")
    env = parse_rollback(payload)
    kid = signed_key_id(env.request, "rollback request")
    data = env.request.encode("utf-8", "surrogatepass")
    verify_bytes(data, env.signature, kid, trusted, allow_unsigned=allow_unsigned)
    try:
        req = _json.decode(data, type=RollbackRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise OtaRejected("bad_manifest", f"malformed rollback request: {exc}") from None
    if not PIPELINE_NAME.fullmatch(req.pipeline):
        raise OtaRejected("bad_manifest", f"rollback request field 'pipeline' must match "
                                          f"[A-Za-z0-9_-]{{1,64}}, got {req.pipeline[:80]!r}")
    if not _NONCE.fullmatch(req.nonce):
        raise OtaRejected("bad_manifest", "rollback request field 'nonce' must be 8-64 lowercase "
                                          "hex digits")
    try:
        created = parse_time(req.created)
    except ValueError:
        raise OtaRejected("bad_manifest", f"rollback request field 'created' is not an ISO-8601 "
                                          f"time: {req.created[:80]!r}") from None
    now = time.time() if now is None else now
    if now - created > max_age_s:
        raise OtaRejected("bad_manifest", f"stale rollback request: created {req.created}, "
                                          f"{now - created:.0f} s ago (limit {max_age_s:g} s)")
    if created - now > FUTURE_SKEW_S:
        raise OtaRejected("bad_manifest", f"rollback request created in the future ({req.created}, "
                                          f"{created - now:.0f} s ahead): check the clocks")
    return req, request_id(env.request, env.signature)


def parse_rollback(payload: bytes) -> _RollbackEnvelope:
    """The envelope of a rollback request (nothing checked but its shape).

    Raises:
        OtaRejected: ``bad_manifest``.
    """
    try:
        return _json.decode(payload, type=_RollbackEnvelope)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise OtaRejected("bad_manifest", f"malformed rollback request: {exc}") from None
