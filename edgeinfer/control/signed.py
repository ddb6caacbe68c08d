"""Signed commands: the verbs of ``mqtt.commands.signed`` run only when signed with a key of
``ota.trusted_keys``, with the OTA scheme (Ed25519 over the exact JSON text, ``ota.manifest``'s
``sign_bytes``/``verify_bytes``), for one device and one verb, recently, and once.

A signed command is the usual request object with two fields (``id`` may sit beside them)::

    {"id": 7, "request": "<the JSON text below>", "signature": "<base64 Ed25519>"}

    {"schema": "edgeinfer-cmd/1", "device": "pi-kitchen", "verb": "set",
     "args": {"score_threshold": 0.7}, "created": "2026-01-31T12:00:00Z",
     "nonce": "<16-64 hex digits>", "key_id": "<the signing key's id>"}

``make_command`` builds one (``edgeinfer cmd --key`` uses it). The device refuses a command for
another device or verb, one created more than ``max_age_s`` ago (or over a minute ahead), and a
nonce it has seen: seen nonces are kept in ``<state_dir>/command-nonces.json`` until they
expire, so a replay is refused after a restart too.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from .. import _json
from ..errors import OtaRejected
from ..keys import PrivateKey, PublicKey
from ..nonces import NonceBook, NonceRefused
from ..ota.manifest import encode, now_iso, parse_time, sign_bytes, verify_bytes
from .commands import CommandError, too_deep

__all__ = ["SCHEMA", "SignedCommands", "make_command"]


SCHEMA = "edgeinfer-cmd/1"
_NONCE = re.compile(r"[0-9a-f]{16,64}")
_FUTURE_SKEW_S = 60.0
_MAX_DEPTH = 16


class SignedRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the signature covers."""

    schema: Literal["edgeinfer-cmd/1"] = "edgeinfer-cmd/1"
    device: str
    verb: str
    args: dict[str, Any] = {}
    created: str
    nonce: str
    key_id: str | None = None


class _Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    request: str
    signature: str | None = None


def make_command(device: str, verb: str, args: Mapping[str, Any] | None, key: PrivateKey, *,
                 request_id: Any = None, created: float | None = None) -> bytes:
    """The payload of a command for ``device`` signed with ``key`` (an
    ``ota.keys.PrivateKey``), created now (or at ``created``) with a random nonce."""
    text = encode(SignedRequest(device=device, verb=verb, args=dict(args or {}),
                                created=now_iso(created), nonce=secrets.token_hex(16),
                                key_id=key.key_id))
    body: dict[str, Any] = {"request": text.decode("utf-8"), "signature": sign_bytes(text, key)}
    if request_id is not None:
        body["id"] = request_id
    return json.dumps(body).encode()


class SignedCommands:
    """Opens signed commands for one device (the ``Opener`` of ``CommandServer``).

    Args:
        device: This device's id; a command for another is refused.
        trusted: The trusted keys by key id (``ota.keys.load_trusted_keys``).
        nonces: Where seen nonces are kept.
        max_age_s: Oldest command accepted.
    """

    def __init__(self, device: str, trusted: Mapping[str, PublicKey], nonces: NonceBook, *,
                 max_age_s: float) -> None:
        self.device = device
        self.trusted = trusted
        self.nonces = nonces
        self.max_age_s = max_age_s

    def open(self, verb: str, request: dict[str, Any], *, now: float | None = None
             ) -> dict[str, Any]:
        """The signed arguments of ``request`` (an envelope) for ``verb``.

        Raises:
            CommandError: not signed, not by a trusted key, not for this device and verb,
                stale, from the future or replayed.
        """
        if "signature" not in request:
            raise CommandError(f"command {verb!r} must be signed (mqtt.commands.signed)")
        try:
            env = msgspec.convert(request, _Envelope, strict=True)
            data = env.request.encode("utf-8", "surrogatepass")
            if too_deep(data, _MAX_DEPTH):
                raise CommandError(f"signed request nested deeper than {_MAX_DEPTH} levels")
            req = _json.decode(data, type=SignedRequest)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise CommandError(f"malformed signed command: {exc}") from None
        try:
            verify_bytes(data, env.signature, req.key_id, self.trusted, allow_unsigned=False)
        except OtaRejected as exc:
            raise CommandError(f"signature refused ({exc.reason}): {exc}") from None
        if req.device != self.device or req.verb != verb:
            raise CommandError(f"the signed command is {req.verb!r} for device "
                               f"{req.device[:64]!r}, not {verb!r} for {self.device!r}")
        if not _NONCE.fullmatch(req.nonce):
            raise CommandError("signed command field 'nonce' must be 16-64 lowercase hex digits")
        try:
            created = parse_time(req.created)
        except (ValueError, OverflowError):
            raise CommandError(f"signed command field 'created' is not an ISO-8601 time: "
                               f"{req.created[:80]!r}") from None
        now = time.time() if now is None else now
        if now - created > self.max_age_s:
            raise CommandError(f"stale signed command: created {req.created}, "
                               f"{now - created:.0f} s ago (limit {self.max_age_s:g} s)")
        if created - now > _FUTURE_SKEW_S:
            raise CommandError(f"signed command created in the future ({req.created}, "
                               f"{created - now:.0f} s ahead): check the clocks")
        try:
            self.nonces.take(req.nonce, created + self.max_age_s + _FUTURE_SKEW_S, now=now)
        except NonceRefused as exc:
            raise CommandError(f"signed command refused: {exc}"
                               if exc.reason == "full" else
                               f"replayed signed command ({exc})") from None
        return dict(req.args)
