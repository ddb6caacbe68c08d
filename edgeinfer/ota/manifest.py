"""The signed manifest: what a pushed model is, its field rules, building it, signing it into
an offer and opening one (``docs/ota.md``).

A device verifies the manifest's exact text against its signature (``signature``) before it
trusts any field, then decodes it into a ``Manifest`` whose construction checks every field
rule. The offer that carries it travels as ``offer.Offer``. The names of ``signature`` and
``offer`` are re-exported here, where the rollback request, signed commands and tests import
them from.

Format 2 binds what a signature allows: the manifest names its ``target`` (a device or a
group), a per-pipeline ``sequence`` (with ``downgrade`` to go below the highest one installed),
an ``expires`` time, and the sha256 of every chunk at the signed ``chunk_size`` (so a device
checks each chunk as it arrives). A request id (``request_id``) names one signed offer or
rollback request; every status answering it carries that id.

Rejections raise ``OtaRejected`` with the protocol's reason codes: ``unsigned``,
``unknown_key``, ``bad_signature``, ``bad_manifest``, ``bad_name`` (``name`` or ``filename``),
``bad_transfer``, ``expired_manifest`` and ``not_yet_valid``.
"""

from __future__ import annotations

import base64
import hashlib
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from .. import _json
from ..errors import OtaRejected, UnsafeModelError
from . import protocol
from ..keys import PrivateKey, PublicKey
from ..runtime.modelfile import inspect_model
from .offer import Offer, TransferInfo, golden_bytes, parse_offer
from .signature import (
    DOMAIN,
    encode,
    now_iso,
    parse_time,
    request_id,
    sign_bytes,
    signed_key_id,
    verify_bytes,
)

__all__ = [
    "DOMAIN",
    "FUTURE_SKEW_S",
    "Golden",
    "Manifest",
    "Offer",
    "PIPELINE_NAME",
    "Target",
    "TransferInfo",
    "build_manifest",
    "check_time",
    "chunk_hashes",
    "decode_manifest",
    "encode",
    "golden_bytes",
    "make_offer",
    "now_iso",
    "check_transfer",
    "open_manifest",
    "open_offer",
    "parse_offer",
    "parse_time",
    "request_id",
    "sign_bytes",
    "signed_key_id",
    "transfer_id",
    "verify_bytes",
]

SCHEMA = "edgeinfer-ota/2"
DEFAULT_CHUNK = 256 * 1024
DEFAULT_TTL_S = 3600.0
MAX_TTL_S = 30 * 86400.0  # a manifest valid for longer is refused (a signer's slip, or a trap)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
PIPELINE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a pipeline name an update may target
_TASK = re.compile(r"[a-z0-9_-]{1,32}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HEX16 = re.compile(r"[0-9a-f]{16}")  # a key id
FUTURE_SKEW_S = 60.0  # how far ahead of our clock a signed "created" may be
_LEVEL = re.compile(r"[^/+#\x00-\x20\x7f]{1,128}")  # one MQTT topic level


def _bad(field: str, why: str, reason: str = "bad_manifest") -> OtaRejected:
    return OtaRejected(reason, f"manifest field {field!r} {why}")


def _check_sha(value: str, field: str) -> None:
    if not _SHA256.fullmatch(value):
        raise _bad(field, f"must be 64 lowercase hex digits, got {value[:80]!r}")


def _check_base_name(value: str, field: str, reason: str) -> None:
    if (not value or len(value) > 255 or "/" in value or "\\" in value or ".." in value
            or value.startswith(".") or not value.isprintable()):
        raise _bad(field, f"must be a plain file name (no '/', '\\', '..' or leading '.'), "
                          f"got {value[:80]!r}", reason)


def _check_created(value: str, field: str = "created") -> None:
    try:
        parse_time(value)
    except ValueError:
        raise _bad(field, f"must be an ISO-8601 UTC time, got {value[:80]!r}") from None


class Golden(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The golden ``.npz`` sent with an offer: its identity and the tolerances of the check.

    Attributes:
        sha256: of the ``.npz`` bytes.
        size: its size in bytes.
        atol: absolute tolerance of ``numpy.allclose``.
        rtol: relative tolerance.
    """

    sha256: str
    size: int
    atol: float = 1e-3
    rtol: float = 1e-3

    def __post_init__(self) -> None:
        _check_sha(self.sha256, "golden.sha256")
        if self.size <= 0:
            raise _bad("golden.size", f"must be > 0, got {self.size}")
        for field, value in (("golden.atol", self.atol), ("golden.rtol", self.rtol)):
            if not (math.isfinite(value) and value >= 0):
                raise _bad(field, f"must be a finite number >= 0, got {value}")


class Target(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
             omit_defaults=True):
    """Whom a signed manifest or rollback request is for: exactly one of ``device`` (a device
    id) and ``group`` (a fleet group). A device takes it only if it names the device itself or
    one of its ``ota.groups``."""

    device: str | None = None
    group: str | None = None

    def __post_init__(self) -> None:
        if (self.device is None) == (self.group is None):
            raise _bad("target", "must name exactly one of device and group")
        value = self.device if self.device is not None else self.group
        if value is None or not _LEVEL.fullmatch(value):
            raise _bad("target", f"must be a device id or group name (one topic level), "
                                 f"got {str(value)[:80]!r}")

    def __str__(self) -> str:
        return f"device {self.device}" if self.device is not None else f"group {self.group}"


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What a pushed model is: checked on construction (and so on decoding).

    Raises ``OtaRejected`` (``bad_name`` for ``name``/``filename``, ``bad_manifest`` for the
    rest) naming the field that breaks a rule of ``docs/ota.md``.
    """

    schema: Literal["edgeinfer-ota/2"] = "edgeinfer-ota/2"
    name: str
    pipeline: str
    version: str
    sha256: str
    size: int
    format: Literal["onnx", "tflite"]
    filename: str
    task: str | None = None
    preprocess: dict[str, Any] | None = None
    golden: Golden | None = None
    target: Target
    sequence: int
    downgrade: bool = False
    created: str
    expires: str
    chunk_size: int
    chunks: list[str]
    key_id: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name) or ".." in self.name:
            raise _bad("name", "must match [A-Za-z0-9][A-Za-z0-9._-]{0,63} without '..', "
                               f"got {self.name[:80]!r}", "bad_name")
        _check_base_name(self.filename, "filename", "bad_name")
        if not PIPELINE_NAME.fullmatch(self.pipeline):
            raise _bad("pipeline", f"must match [A-Za-z0-9_-]{{1,64}}, got {self.pipeline[:80]!r}")
        if not (1 <= len(self.version) <= 64 and self.version.isprintable() and "/" not in self.version):
            raise _bad("version", f"must be 1-64 printable characters without '/', "
                                  f"got {self.version[:80]!r}")
        _check_sha(self.sha256, "sha256")
        if self.size <= 0:
            raise _bad("size", f"must be > 0, got {self.size}")
        if self.task is not None and not _TASK.fullmatch(self.task):
            raise _bad("task", f"must be a task name such as 'detect', got {self.task[:80]!r}")
        _check_created(self.created)
        _check_created(self.expires, "expires")
        lifetime = parse_time(self.expires) - parse_time(self.created)
        if not 0 < lifetime <= MAX_TTL_S:
            raise _bad("expires", f"must be after 'created' and at most {MAX_TTL_S / 86400:g} "
                                  f"days after it, got {self.expires[:80]!r}")
        if not 0 <= self.sequence < 2**63:
            raise _bad("sequence", f"must be an integer 0 <= n < 2**63, got {self.sequence}")
        if not protocol.MIN_CHUNK <= self.chunk_size <= protocol.MAX_CHUNK:
            raise _bad("chunk_size", f"must be {protocol.MIN_CHUNK}..{protocol.MAX_CHUNK}, "
                                     f"got {self.chunk_size}")
        count = math.ceil(self.size / self.chunk_size)
        if len(self.chunks) != count:
            raise _bad("chunks", f"must list {count} chunk sha256s ({self.size} bytes in chunks "
                                 f"of {self.chunk_size}), got {len(self.chunks)}")
        for i, digest in enumerate(self.chunks):
            _check_sha(digest, f"chunks[{i}]")
        if self.key_id is not None and not _HEX16.fullmatch(self.key_id):
            raise _bad("key_id", f"must be 16 lowercase hex digits, got {self.key_id[:80]!r}")


# -- helpers -----------------------------------------------------------------------------------
def transfer_id(sha256: str) -> str:
    """The transfer id of a model: the first 16 hex digits of its sha256."""
    return sha256[:16]


def chunk_hashes(path: Path, chunk_size: int) -> list[str]:
    """The sha256 of each ``chunk_size`` piece of the file at ``path``."""
    out = []
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            out.append(hashlib.sha256(block).hexdigest())
    return out


def check_time(manifest: Manifest, now: float | None = None) -> None:
    """Refuse a manifest past its ``expires`` time or created in the future (beyond a minute).

    Raises:
        OtaRejected: ``expired_manifest`` or ``not_yet_valid``.
    """
    now = time.time() if now is None else now
    if now > parse_time(manifest.expires):
        raise OtaRejected("expired_manifest", f"the manifest expired at {manifest.expires} "
                          f"(created {manifest.created}); sign a new one")
    if parse_time(manifest.created) - now > FUTURE_SKEW_S:
        raise OtaRejected("not_yet_valid", f"the manifest was created {manifest.created}, in "
                          "this device's future: check the clocks")


def _sanitise(name: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", name)
    name = re.sub(r"\.{2,}", ".", name)
    name = name.lstrip("._-")[:64].rstrip(".")
    return name or "model"


def build_manifest(
    model_path: str | os.PathLike[str],
    *,
    pipeline: str,
    version: str,
    target: Target,
    sequence: int | None = None,
    downgrade: bool = False,
    chunk_size: int = DEFAULT_CHUNK,
    ttl_s: float = DEFAULT_TTL_S,
    name: str | None = None,
    task: str | None = None,
    preprocess: dict[str, Any] | None = None,
    golden: Golden | None = None,
    key_id: str | None = None,
    now: float | None = None,
) -> Manifest:
    """The manifest of a model file, ``created`` now and valid for ``ttl_s``.

    Args:
        model_path: the ONNX or TFLite file to push (one file: no external data).
        pipeline: the device pipeline whose model it replaces.
        version: shown in results' ``model.version``.
        target: the device or group it is for.
        sequence: the pipeline's update sequence (default: the time in milliseconds); a
            device refuses one not above the highest it installed unless ``downgrade``.
        downgrade: allow a sequence below the highest installed (a deliberate downgrade).
        chunk_size: bytes per chunk; each chunk's sha256 is in the manifest.
        ttl_s: seconds from ``created`` to ``expires``.
        name: the store's folder name; default the file's stem, sanitised.
        task: the task the model is for (``detect``, ``classify``, ...), checked by the device.
        preprocess: informational preprocessing notes.
        golden: the golden file's identity, when one goes with the offer.
        key_id: the signing key's id (``PrivateKey.key_id``); None for an unsigned push.
        now: the Unix time to sign at (default now; tests).

    Raises:
        ModelError: the file is missing, not a model, or (``UnsafeModelError``) has external data.
        OtaRejected: a field breaks the manifest's rules (a bad name, pipeline or version).
    """
    path = Path(model_path)
    info = inspect_model(path)
    if info.onnx is not None and info.onnx.external_data:
        raise UnsafeModelError(f"{path}: a pushed model must be one file, but it has external data "
                               f"({', '.join(sorted(info.onnx.external_data))})")
    now = time.time() if now is None else now
    if not protocol.MIN_CHUNK <= chunk_size <= protocol.MAX_CHUNK:
        raise _bad("chunk_size", f"must be {protocol.MIN_CHUNK}..{protocol.MAX_CHUNK}, "
                                 f"got {chunk_size}")
    return Manifest(
        name=_sanitise(path.stem) if name is None else name,
        pipeline=pipeline,
        version=version,
        sha256=info.sha256,
        size=path.stat().st_size,
        format=info.format,  # type: ignore[arg-type]  # detect_format returns one of the two
        filename=_sanitise(path.name),
        task=task,
        preprocess=preprocess,
        golden=golden,
        target=target,
        sequence=int(now * 1000) if sequence is None else sequence,
        downgrade=downgrade,
        created=now_iso(now),
        expires=now_iso(now + ttl_s),
        chunk_size=chunk_size,
        chunks=chunk_hashes(path, chunk_size),
        key_id=key_id,
    )


# -- offers ------------------------------------------------------------------------------------
def make_offer(manifest: Manifest, key: PrivateKey | None,
               golden: bytes | None = None) -> bytes:
    """The offer JSON for ``manifest``, signed with ``key`` (None: unsigned); its transfer
    section repeats the manifest's chunking.

    Raises:
        ValueError: ``manifest.key_id`` not ``key.key_id``, golden bytes that do not match
            ``manifest.golden``, or an offer over ``MAX_OFFER_BYTES``.
    """
    chunk_size = manifest.chunk_size
    if key is not None and manifest.key_id != key.key_id:
        raise ValueError(f"the manifest's key_id {manifest.key_id!r} is not the signing key's "
                         f"{key.key_id!r} (build it with key_id=key.key_id)")
    if (golden is None) != (manifest.golden is None):
        raise ValueError("golden bytes go with an offer exactly when the manifest has a golden entry")
    if golden is not None and manifest.golden is not None and (
            len(golden) != manifest.golden.size
            or hashlib.sha256(golden).hexdigest() != manifest.golden.sha256):
        raise ValueError("the golden bytes do not match the manifest's golden sha256/size")
    text = encode(manifest)
    offer = Offer(
        manifest=text.decode("utf-8"),
        signature=sign_bytes(text, key) if key is not None else None,
        transfer=TransferInfo(id=transfer_id(manifest.sha256), chunk_size=chunk_size,
                              chunks=len(manifest.chunks)),
        golden=base64.b64encode(golden).decode("ascii") if golden is not None else None,
    )
    payload = encode(offer)
    if len(payload) > protocol.MAX_OFFER_BYTES:
        raise ValueError(f"the offer is {len(payload)} bytes, over the protocol's "
                         f"{protocol.MAX_OFFER_BYTES} (a smaller golden file?)")
    return payload


def decode_manifest(text: bytes | str) -> Manifest:
    """Decode and check a manifest's JSON text (signature not checked: see ``open_offer``).

    Raises:
        OtaRejected: ``bad_manifest`` / ``bad_name`` naming the field.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    try:
        return _json.decode(data, type=Manifest)
    except msgspec.ValidationError as exc:
        raise OtaRejected("bad_manifest", f"malformed manifest: {exc}") from None
    except msgspec.DecodeError as exc:
        raise OtaRejected("bad_manifest", f"the manifest is not valid JSON: {exc}") from None


def open_offer(offer: Offer, trusted: Mapping[str, PublicKey], *, allow_unsigned: bool) -> Manifest:
    """Verify an offer's signature, then decode and check its manifest and transfer (which
    must repeat the signed chunking): ``open_manifest`` then ``check_transfer``. Time, target
    and sequence are the device's to check (``check_time``, the agent).

    Raises:
        OtaRejected: as ``open_manifest`` and ``check_transfer``.
    """
    manifest = open_manifest(offer, trusted, allow_unsigned=allow_unsigned)
    check_transfer(offer, manifest)
    return manifest


def open_manifest(offer: Offer, trusted: Mapping[str, PublicKey], *,
                  allow_unsigned: bool) -> Manifest:
    """Verify an offer's signature, then decode and check its manifest.

    Raises:
        OtaRejected: ``unsigned``/``unknown_key``/``bad_signature`` (``verify_bytes``),
            ``bad_manifest``/``bad_name`` for a manifest field.
    """
    kid = signed_key_id(offer.manifest, "manifest")
    data = offer.manifest.encode("utf-8", "surrogatepass")
    verify_bytes(data, offer.signature, kid, trusted, allow_unsigned=allow_unsigned)
    return decode_manifest(data)


def check_transfer(offer: Offer, manifest: Manifest) -> None:
    """Check the offer's unsigned parts (transfer section, golden file) against its signed
    manifest.

    Raises:
        OtaRejected: ``bad_transfer`` for a transfer that does not repeat the manifest's,
            ``bad_manifest`` for a golden file that does not match it.
    """
    t = offer.transfer
    if t.id != transfer_id(manifest.sha256):
        raise OtaRejected("bad_transfer", f"transfer id {t.id} is not the first 16 hex digits of "
                                          "the manifest's sha256")
    if t.chunk_size != manifest.chunk_size or t.chunks != len(manifest.chunks):
        raise OtaRejected("bad_transfer", f"the transfer announces {t.chunks} chunks of "
                                          f"{t.chunk_size} bytes, the signed manifest "
                                          f"{len(manifest.chunks)} of {manifest.chunk_size}")
    golden = golden_bytes(offer)
    if (golden is None) != (manifest.golden is None):
        raise OtaRejected("bad_manifest", "a golden file must come with the offer exactly when the "
                                          "manifest names one")
    if golden is not None and manifest.golden is not None and (
            len(golden) != manifest.golden.size
            or hashlib.sha256(golden).hexdigest() != manifest.golden.sha256):
        raise OtaRejected("bad_manifest", "the golden file does not match the manifest's "
                                          "golden sha256/size")
