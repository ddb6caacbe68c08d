"""Manifests, offers and rollback requests: building, signing, and every rejection."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from edgeinfer.errors import ModelFormatError, ModelNotFoundError, OtaRejected
from edgeinfer.ota import protocol
from edgeinfer.ota.keys import PrivateKey, PublicKey
from edgeinfer.ota.manifest import (
    DOMAIN,
    Golden,
    Manifest,
    Offer,
    Target,
    build_manifest,
    check_time,
    encode,
    golden_bytes,
    make_offer,
    now_iso,
    open_offer,
    parse_offer,
    parse_time,
    request_id,
    sign_bytes,
    transfer_id,
    verify_bytes,
)
from edgeinfer.ota.rollback import make_rollback, open_rollback
from edgeinfer.testing import onnx_models, tflite_models

# Signatures are checked on the device: these run in the arm64 subset too.
pytestmark = pytest.mark.arm64

CHUNK = protocol.MIN_CHUNK
SHA = "ab" * 32
T = Target(device="pi")


@pytest.fixture(scope="module")
def key() -> PrivateKey:
    return PrivateKey.generate()


@pytest.fixture(scope="module")
def trusted(key: PrivateKey) -> dict[str, PublicKey]:
    return {key.key_id: key.public}


def _manifest(**kw: Any) -> Manifest:
    fields: dict[str, Any] = dict(name="face", pipeline="faces", version="2.0.0", sha256=SHA,
                                  size=200_000, format="onnx", filename="face.onnx",
                                  target=Target(device="pi"), sequence=7,
                                  created="2026-11-21T12:00:00Z", expires="2026-11-21T13:00:00Z",
                                  chunk_size=CHUNK, chunks=["cd" * 32] * 4)
    fields.update(kw)
    return Manifest(**fields)


def _offer_dict(manifest_text: str, signature: str | None, *, size: int = 200_000,
                sha: str = SHA, chunk: int = CHUNK, golden: str | None = None) -> dict[str, Any]:
    return {"manifest": manifest_text, "signature": signature,
            "transfer": {"id": sha[:16], "chunk_size": chunk, "chunks": math.ceil(size / chunk)},
            "golden": golden}


def _signed_raw(key: PrivateKey, fields: dict[str, Any]) -> bytes:
    """An offer whose manifest JSON is written by hand (no Manifest checks), properly signed."""
    text = json.dumps(fields)
    return json.dumps(_offer_dict(text, sign_bytes(text.encode(), key))).encode()


def _base_fields(key: PrivateKey) -> dict[str, Any]:
    return json.loads(encode(_manifest(key_id=key.key_id)))  # type: ignore[no-any-return]


# -- building --------------------------------------------------------------------------------
def test_build_manifest_onnx(tmp_path: Path, key: PrivateKey) -> None:
    path = onnx_models.add_model(tmp_path / "My Model v1.onnx")
    m = build_manifest(path, pipeline="detect", version="1.0.0", task="raw", key_id=key.key_id,
                       target=T)
    assert m.format == "onnx" and m.size == path.stat().st_size
    assert m.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert m.name == "My-Model-v1" and m.filename == "My-Model-v1.onnx"
    assert m.schema == "edgeinfer-ota/2" and m.key_id == key.key_id and m.golden is None
    assert time.strptime(m.created, "%Y-%m-%dT%H:%M:%SZ")
    assert abs(time.time() - parse_time(m.created)) < 5


def test_build_manifest_tflite_format_from_bytes(tmp_path: Path) -> None:
    path = tflite_models.add_model(tmp_path / "face.onnx")  # wrong extension: bytes decide
    m = build_manifest(path, pipeline="faces", version="2", name="face", target=T)
    assert m.format == "tflite" and m.name == "face" and m.key_id is None


def test_build_manifest_bad_file_and_bad_fields(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError):
        build_manifest(tmp_path / "nope.onnx", pipeline="p", version="1", target=T)
    (tmp_path / "x.onnx").write_text("<html>not found</html>")
    with pytest.raises(ModelFormatError):
        build_manifest(tmp_path / "x.onnx", pipeline="p", version="1", target=T)
    path = onnx_models.add_model(tmp_path / "m.onnx")
    with pytest.raises(OtaRejected, match="pipeline") as err:
        build_manifest(path, pipeline="a/b", version="1", target=T)
    assert err.value.reason == "bad_manifest"
    with pytest.raises(OtaRejected, match="version"):
        build_manifest(path, pipeline="p", version="1/2", target=T)
    with pytest.raises(OtaRejected, match="version"):
        build_manifest(path, pipeline="p", version="x" * 65, target=T)
    with pytest.raises(OtaRejected, match="version"):
        build_manifest(path, pipeline="p", version="1\n", target=T)


# -- offers ----------------------------------------------------------------------------------
def test_offer_round_trip_signed(tmp_path: Path, key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    path = onnx_models.add_model(tmp_path / "m.onnx")
    m = build_manifest(path, pipeline="detect", version="1.0.0", key_id=key.key_id, target=T,
                       chunk_size=CHUNK)
    payload = make_offer(m, key)
    offer = parse_offer(payload)
    assert offer.transfer.id == transfer_id(m.sha256) == m.sha256[:16]
    assert offer.transfer.chunks == math.ceil(m.size / CHUNK) and offer.golden is None
    # the signature is over DOMAIN + the exact manifest text in the offer
    raw = json.loads(payload)
    assert key.public.verify(DOMAIN + raw["manifest"].encode(), base64.b64decode(raw["signature"]))
    assert open_offer(offer, trusted, allow_unsigned=False) == m
    assert open_offer(offer, trusted, allow_unsigned=True) == m


def test_offer_round_trip_unsigned_with_golden(tmp_path: Path) -> None:
    path = tflite_models.add_model(tmp_path / "m.tflite")
    blob = b"golden npz bytes" * 10
    g = Golden(sha256=hashlib.sha256(blob).hexdigest(), size=len(blob), atol=0.01)
    m = build_manifest(path, pipeline="faces", version="2", golden=g, target=T,
                       chunk_size=protocol.MAX_CHUNK)
    offer = parse_offer(make_offer(m, None, golden=blob))
    assert offer.signature is None
    assert open_offer(offer, {}, allow_unsigned=True) == m
    assert golden_bytes(offer) == blob
    with pytest.raises(OtaRejected) as err:
        open_offer(offer, {}, allow_unsigned=False)
    assert err.value.reason == "unsigned"


def test_make_offer_argument_errors(key: PrivateKey) -> None:
    m = _manifest(key_id=key.key_id)
    with pytest.raises(ValueError, match="key_id"):
        make_offer(_manifest(), key)
    with pytest.raises(ValueError, match="golden"):
        make_offer(m, key, golden=b"x")
    g = Golden(sha256=SHA, size=3)
    with pytest.raises(ValueError, match="golden"):
        make_offer(_manifest(key_id=key.key_id, golden=g), key, golden=b"abc")


def _reason(payload: bytes, trusted: dict[str, PublicKey], allow_unsigned: bool = False) -> str:
    with pytest.raises(OtaRejected) as err:
        open_offer(parse_offer(payload), trusted, allow_unsigned=allow_unsigned)
    return err.value.reason


def test_rejects_unsigned_and_unknown_key(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    assert _reason(make_offer(_manifest(), None), trusted) == "unsigned"
    other = PrivateKey.generate()
    payload = make_offer(_manifest(key_id=other.key_id), other)
    assert _reason(payload, trusted) == "unknown_key"
    # a signed offer is checked even when unsigned ones are allowed
    assert _reason(payload, trusted, allow_unsigned=True) == "unknown_key"
    # signed, but the manifest names no key
    text = encode(_manifest()).decode()
    no_kid = json.dumps(_offer_dict(text, sign_bytes(text.encode(), key))).encode()
    assert _reason(no_kid, trusted, allow_unsigned=True) == "unknown_key"


def test_rejects_bad_signature(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    raw = json.loads(make_offer(_manifest(key_id=key.key_id), key))
    # one byte of the manifest text flipped (the version), signature untouched
    flipped = dict(raw, manifest=raw["manifest"].replace('"2.0.0"', '"2.0.1"'))
    assert flipped["manifest"] != raw["manifest"]
    assert _reason(json.dumps(flipped).encode(), trusted) == "bad_signature"
    assert _reason(json.dumps(flipped).encode(), trusted, allow_unsigned=True) == "bad_signature"
    # re-serialised text (same fields, other whitespace) no longer verifies either
    spaced = dict(raw, manifest=json.dumps(json.loads(raw["manifest"]), indent=1))
    assert _reason(json.dumps(spaced).encode(), trusted) == "bad_signature"
    # one byte of the signature flipped
    sig = bytearray(base64.b64decode(raw["signature"]))
    sig[10] ^= 0x01
    bad_sig = dict(raw, signature=base64.b64encode(bytes(sig)).decode())
    assert _reason(json.dumps(bad_sig).encode(), trusted) == "bad_signature"
    assert _reason(json.dumps(dict(raw, signature="not base64!")).encode(), trusted) == "bad_signature"
    assert _reason(json.dumps(dict(raw, signature="")).encode(), trusted) == "bad_signature"


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "..", "a..b", "", "-x", "x" * 65, "a\\b"])
def test_rejects_bad_name(key: PrivateKey, trusted: dict[str, PublicKey], name: str) -> None:
    fields = dict(_base_fields(key), name=name)
    with pytest.raises(OtaRejected, match="'name'") as err:
        open_offer(parse_offer(_signed_raw(key, fields)), trusted, allow_unsigned=False)
    assert err.value.reason == "bad_name"


@pytest.mark.parametrize("filename", ["../x.onnx", "a/b.onnx", ".hidden", "a\\b.onnx", ""])
def test_rejects_bad_filename(key: PrivateKey, trusted: dict[str, PublicKey], filename: str) -> None:
    fields = dict(_base_fields(key), filename=filename)
    with pytest.raises(OtaRejected, match="'filename'") as err:
        open_offer(parse_offer(_signed_raw(key, fields)), trusted, allow_unsigned=False)
    assert err.value.reason == "bad_name"


@pytest.mark.parametrize(("field", "value"), [
    ("sha256", "AB" * 32), ("sha256", "ab" * 31), ("sha256", "zz" * 32),
    ("size", 0), ("size", -5), ("pipeline", "a/b"), ("pipeline", "a+"), ("pipeline", ""),
    ("version", ""), ("version", "a/b"), ("version", "v\x01"), ("format", "pt"),
    ("created", "yesterday"), ("key_id", "XYZ"), ("schema", "edgeinfer-ota/1"),
    ("task", "Detect!"), ("golden", {"sha256": "x", "size": 1}), ("size", "12"),
    ("target", {}), ("target", {"device": "a", "group": "b"}), ("target", {"device": "a/b"}),
    ("sequence", -1), ("expires", "2026-11-21T11:00:00Z"), ("expires", "2027-11-21T12:00:00Z"),
    ("chunk_size", 1024), ("chunks", ["cd" * 32] * 3), ("chunks", ["CD" * 32] * 4),
])
def test_rejects_bad_manifest_fields(key: PrivateKey, trusted: dict[str, PublicKey],
                                     field: str, value: Any) -> None:
    fields = dict(_base_fields(key), **{field: value})
    if field == "key_id":
        fields["key_id"] = key.key_id  # signature lookup needs it; break it after signing below
        text = json.dumps(dict(fields, key_id=value))
        payload = json.dumps(_offer_dict(text, None)).encode()
        with pytest.raises(OtaRejected, match="key_id") as err:
            open_offer(parse_offer(payload), trusted, allow_unsigned=True)
    else:
        with pytest.raises(OtaRejected, match=field) as err:
            open_offer(parse_offer(_signed_raw(key, fields)), trusted, allow_unsigned=False)
    assert err.value.reason == "bad_manifest"


def test_rejects_unknown_and_missing_manifest_fields(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    fields = dict(_base_fields(key), extra=1)
    with pytest.raises(OtaRejected, match="extra") as err:
        open_offer(parse_offer(_signed_raw(key, fields)), trusted, allow_unsigned=False)
    assert err.value.reason == "bad_manifest"
    fields = _base_fields(key)
    del fields["version"]
    with pytest.raises(OtaRejected, match="version") as err:
        open_offer(parse_offer(_signed_raw(key, fields)), trusted, allow_unsigned=False)
    assert err.value.reason == "bad_manifest"
    # a manifest that is not JSON at all
    payload = json.dumps(_offer_dict("{not json", None)).encode()
    with pytest.raises(OtaRejected, match="not valid JSON") as err:
        open_offer(parse_offer(payload), trusted, allow_unsigned=True)
    assert err.value.reason == "bad_manifest"


def test_rejects_bad_transfer(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    m = _manifest(key_id=key.key_id)  # 200000 bytes: 4 chunks of 64 KiB
    raw = json.loads(make_offer(m, key))
    assert raw["transfer"]["chunks"] == 4

    def reason(**transfer: Any) -> str:
        payload = json.dumps(dict(raw, transfer=dict(raw["transfer"], **transfer))).encode()
        with pytest.raises(OtaRejected) as err:
            open_offer(parse_offer(payload), trusted, allow_unsigned=False)
        return err.value.reason

    assert reason(chunks=3) == "bad_transfer"
    assert reason(chunks=5) == "bad_transfer"
    assert reason(chunks=0) == "bad_transfer"
    assert reason(chunk_size=CHUNK - 1) == "bad_transfer"
    assert reason(chunk_size=protocol.MAX_CHUNK + 1) == "bad_transfer"
    assert reason(id="cd" * 8) == "bad_transfer"  # not the sha256's prefix
    assert reason(id="AB" * 8) == "bad_transfer"  # not lowercase hex
    assert reason(id="abc") == "bad_transfer"
    assert reason(chunks="4") == "bad_transfer"  # wrong type
    assert reason(extra=1) == "bad_transfer"


def test_rejects_golden_mismatch(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    blob = b"npz" * 100
    g = Golden(sha256=hashlib.sha256(blob).hexdigest(), size=len(blob))
    raw = json.loads(make_offer(_manifest(key_id=key.key_id, golden=g), key, golden=blob))
    for golden in (None, base64.b64encode(blob[:-1]).decode(), "!!"):
        payload = json.dumps(dict(raw, golden=golden)).encode()
        with pytest.raises(OtaRejected, match="golden") as err:
            open_offer(parse_offer(payload), trusted, allow_unsigned=False)
        assert err.value.reason == "bad_manifest"
    raw = json.loads(make_offer(_manifest(key_id=key.key_id), key))
    payload = json.dumps(dict(raw, golden=base64.b64encode(blob).decode())).encode()
    assert _reason(payload, trusted) == "bad_manifest"


def test_parse_offer_rejects_oversize_malformed_and_unknown_fields(key: PrivateKey) -> None:
    good = json.loads(make_offer(_manifest(key_id=key.key_id), key))

    def reason(payload: bytes) -> str:
        with pytest.raises(OtaRejected) as err:
            parse_offer(payload)
        return err.value.reason

    assert reason(b" " * (protocol.MAX_OFFER_BYTES + 1)) == "bad_transfer"
    assert reason(b"{\"manifest\": ") == "bad_manifest"
    assert reason(b"not json") == "bad_manifest"
    assert reason(b"[]") == "bad_manifest"
    assert reason(json.dumps(dict(good, surprise=True)).encode()) == "bad_manifest"
    assert reason(json.dumps(dict(good, manifest=5)).encode()) == "bad_manifest"
    assert reason(json.dumps({k: v for k, v in good.items() if k != "transfer"}).encode()) == "bad_manifest"
    # "golden" may be absent as well as null
    assert parse_offer(json.dumps({k: v for k, v in good.items() if k != "golden"}).encode()).golden is None
    assert isinstance(parse_offer(json.dumps(good).encode()), Offer)


def test_verify_bytes_directly(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    sig = sign_bytes(b"data", key)
    verify_bytes(b"data", sig, key.key_id, trusted, allow_unsigned=False)
    verify_bytes(b"data", None, None, trusted, allow_unsigned=True)
    # a signature without the domain prefix is not accepted
    plain = base64.b64encode(key.sign(b"data")).decode()
    with pytest.raises(OtaRejected) as err:
        verify_bytes(b"data", plain, key.key_id, trusted, allow_unsigned=True)
    assert err.value.reason == "bad_signature"


# -- rollback requests ----------------------------------------------------------------------
def test_rollback_round_trip_and_staleness(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    payload = make_rollback("faces", key, target=T)
    req, rid = open_rollback(payload, trusted, allow_unsigned=False)
    assert req.pipeline == "faces" and req.action == "rollback" and req.key_id == key.key_id
    assert req.target == T and len(req.nonce) == 16
    env = json.loads(payload)
    assert rid == request_id(env["request"], env["signature"])
    fresh = make_rollback("faces", key, target=T)
    with pytest.raises(OtaRejected, match="stale") as err:
        open_rollback(fresh, trusted, allow_unsigned=False, now=time.time() + 901)
    assert err.value.reason == "bad_manifest"
    with pytest.raises(OtaRejected, match="future"):
        open_rollback(fresh, trusted, allow_unsigned=False, now=time.time() - 120)
    assert open_rollback(fresh, trusted, allow_unsigned=False, now=time.time() + 800)
    with pytest.raises(ValueError):
        make_rollback("a/b", key, target=T)


def test_rollback_signature_checks(key: PrivateKey, trusted: dict[str, PublicKey]) -> None:
    unsigned = make_rollback("faces", None, target=T)
    with pytest.raises(OtaRejected) as err:
        open_rollback(unsigned, trusted, allow_unsigned=False)
    assert err.value.reason == "unsigned"
    assert open_rollback(unsigned, trusted, allow_unsigned=True)[0].key_id is None
    raw = json.loads(make_rollback("faces", key, target=T))
    tampered = dict(raw, request=raw["request"].replace('"faces"', '"other"'))
    with pytest.raises(OtaRejected) as err:
        open_rollback(json.dumps(tampered).encode(), trusted, allow_unsigned=True)
    assert err.value.reason == "bad_signature"
    other = PrivateKey.generate()
    with pytest.raises(OtaRejected) as err:
        open_rollback(make_rollback("faces", other, target=T), trusted, allow_unsigned=True)
    assert err.value.reason == "unknown_key"
    for bad in (b"nope", b"{}", json.dumps({"request": "{", "signature": None}).encode()):
        with pytest.raises(OtaRejected) as err:
            open_rollback(bad, trusted, allow_unsigned=True)
        assert err.value.reason == "bad_manifest"
    text = json.dumps({"schema": "edgeinfer-ota/2", "action": "rollback", "pipeline": "faces",
                       "target": {"device": "pi"}, "created": now_iso(), "nonce": "../../x",
                       "key_id": key.key_id})
    env = json.dumps({"request": text, "signature": sign_bytes(text.encode(), key)}).encode()
    with pytest.raises(OtaRejected, match="nonce"):
        open_rollback(env, trusted, allow_unsigned=False)


def test_manifest_json_field_names_match_the_contract() -> None:
    m = _manifest(golden=Golden(sha256=SHA, size=10))
    assert list(msgspec.json.decode(encode(m))) == [
        "schema", "name", "pipeline", "version", "sha256", "size", "format", "filename", "task",
        "preprocess", "golden", "target", "sequence", "downgrade", "created", "expires",
        "chunk_size", "chunks", "key_id"]


def test_manifest_binds_chunks_time_target_and_sequence(tmp_path: Path) -> None:
    path = onnx_models.tiny_classifier(tmp_path / "m.onnx", classes=4096)
    data = path.read_bytes()
    m = build_manifest(path, pipeline="p", version="1", target=Target(group="line-3"),
                       chunk_size=CHUNK, ttl_s=600, now=1_800_000_000.0)
    assert m.chunks == [hashlib.sha256(data[i:i + CHUNK]).hexdigest()
                        for i in range(0, len(data), CHUNK)]
    assert len(m.chunks) >= 2 and m.chunk_size == CHUNK
    assert m.sequence == 1_800_000_000_000 and not m.downgrade
    assert parse_time(m.expires) - parse_time(m.created) == 600
    assert encode(m.target) == b'{"group":"line-3"}'
    check_time(m, now=1_800_000_000.0 + 599)
    with pytest.raises(OtaRejected) as err:  # past its expiry: a capture replayed later
        check_time(m, now=1_800_000_000.0 + 601)
    assert err.value.reason == "expired_manifest"
    with pytest.raises(OtaRejected) as err:  # dated ahead of the device's clock
        check_time(m, now=1_800_000_000.0 - 120)
    assert err.value.reason == "not_yet_valid"
    old = build_manifest(path, pipeline="p", version="1", target=T, now=978_307_200.0)  # 2001
    with pytest.raises(OtaRejected) as err:
        check_time(old)
    assert err.value.reason == "expired_manifest"


def test_transfer_section_must_repeat_the_signed_chunking(key: PrivateKey,
                                                          trusted: dict[str, PublicKey]) -> None:
    raw = json.loads(make_offer(_manifest(key_id=key.key_id), key))
    for transfer in ({"chunk_size": CHUNK * 2, "chunks": 2}, {"chunks": 5}):
        payload = json.dumps(dict(raw, transfer=dict(raw["transfer"], **transfer))).encode()
        with pytest.raises(OtaRejected, match="signed manifest") as err:
            open_offer(parse_offer(payload), trusted, allow_unsigned=False)
        assert err.value.reason == "bad_transfer"


def test_request_id_names_text_and_signature() -> None:
    assert request_id("{}", "c2ln") != request_id("{}", "b3RoZXI=")  # a forged copy differs
    assert request_id("{}", None) != request_id("{ }", None)
    assert request_id("{}", "c2ln") == request_id("{}", "c2ln")
    assert len(request_id("{}", None)) == 16
