"""Ed25519 key files: keygen, loading private keys, trusted public keys (real crypto)."""

from __future__ import annotations

import base64
import logging
import os
import stat
from pathlib import Path

import pytest

from edgeinfer.errors import ConfigError
from edgeinfer.ota.keys import (
    PrivateKey,
    PublicKey,
    generate_keypair,
    key_id,
    load_private_key,
    load_trusted_keys,
    parse_public_keys,
)

# Signatures are checked on the device: these run in the arm64 subset too.
pytestmark = pytest.mark.arm64


@pytest.fixture(scope="module")
def rsa_pem() -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def test_keygen_writes_private_0600_and_pub_line(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        priv, pub, kid = generate_keypair(tmp_path / "ota-key")
    finally:
        os.umask(old)
    assert priv == tmp_path / "ota-key" and pub == tmp_path / "ota-key.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    text = pub.read_text()
    assert text.endswith("\n") and text.count("\n") == 1
    b64, comment = text.strip().removeprefix("ed25519:").split(" ")
    raw = base64.b64decode(b64)
    assert len(raw) == 32 and comment == kid == key_id(raw) and len(kid) == 16
    key = load_private_key(priv)
    assert key.key_id == kid and key.public.raw == raw
    assert key.public.line() == text.strip()


def test_keygen_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    priv, pub, kid = generate_keypair(tmp_path / "k")
    before = priv.read_bytes()
    with pytest.raises(ConfigError, match="already exist") as err:
        generate_keypair(tmp_path / "k")
    assert str(priv) in str(err.value) and str(pub) in str(err.value)
    assert priv.read_bytes() == before
    pub.unlink()  # only the .pub missing: still refused, nothing written
    with pytest.raises(ConfigError, match=str(priv)):
        generate_keypair(tmp_path / "k")
    assert not pub.exists()
    priv2, pub2, kid2 = generate_keypair(tmp_path / "k", force=True)
    assert kid2 != kid and priv2.read_bytes() != before
    assert stat.S_IMODE(priv2.stat().st_mode) == 0o600
    assert load_private_key(priv2).key_id == kid2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k", "k.pub"]  # no temporaries left


def test_keygen_unwritable_folder_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot write"):
        generate_keypair(tmp_path / "missing" / "k")


def test_sign_verify_round_trip_and_wrong_key() -> None:
    a, b = PrivateKey.generate(), PrivateKey.generate()
    sig = a.sign(b"model bytes")
    assert len(sig) == 64
    assert a.public.verify(b"model bytes", sig)
    assert not a.public.verify(b"model bytez", sig)
    assert not b.public.verify(b"model bytes", sig)
    assert not a.public.verify(b"model bytes", sig[:-1])  # malformed: False, not an exception
    assert not a.public.verify(b"model bytes", b"")


def test_load_private_key_refuses_pub_file(tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    _, pub, _ = generate_keypair(tmp_path / "k")
    pub.chmod(0o644)  # as public keys are: no "chmod 600 it" hint for one given as --key
    with caplog.at_level("WARNING"), \
            pytest.raises(ConfigError, match=r"is a public key; .*without \.pub"):
        load_private_key(pub)
    assert "chmod" not in caplog.text


def test_load_private_key_refuses_rsa(tmp_path: Path, rsa_pem: bytes) -> None:
    path = tmp_path / "rsa.pem"
    path.write_bytes(rsa_pem)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="RSA key, not Ed25519"):
        load_private_key(path)


def test_load_private_key_missing_garbage_and_encrypted(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_private_key(tmp_path / "nope")
    (tmp_path / "junk").write_text("hello\n")
    with pytest.raises(ConfigError, match="not a PEM private key"):
        load_private_key(tmp_path / "junk")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    enc = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw"))
    (tmp_path / "enc").write_bytes(enc)
    with pytest.raises(ConfigError, match="encrypted"):
        load_private_key(tmp_path / "enc")


def test_load_private_key_warns_when_group_readable(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    priv, _, _ = generate_keypair(tmp_path / "k")
    with caplog.at_level(logging.WARNING, logger="edgeinfer.ota.keys"):
        load_private_key(priv)
        assert not caplog.records
        priv.chmod(0o640)
        load_private_key(priv)
    assert any("readable" in r.getMessage() for r in caplog.records)


def _pem_public(key: PrivateKey) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(key.public.raw).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def test_trusted_keys_from_file_inline_and_pem(tmp_path: Path) -> None:
    k1, k2, k3 = PrivateKey.generate(), PrivateKey.generate(), PrivateKey.generate()
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "fleet.pub").write_text(
        f"# fleet keys\n\n{k1.public.line()}\n  ed25519:{base64.b64encode(k2.public.raw).decode()}\n")
    (tmp_path / "pem.pub").write_text(_pem_public(k3))
    trusted = load_trusted_keys(["keys/fleet.pub", str(tmp_path / "pem.pub"), k1.public.line()],
                                base_dir=tmp_path)
    assert set(trusted) == {k1.key_id, k2.key_id, k3.key_id}
    assert trusted[k3.key_id] == PublicKey(key_id=k3.key_id, raw=k3.public.raw)
    # inline PEM, and a PEM mixed with lines in one text
    mixed = parse_public_keys(f"{k1.public.line()}\n{_pem_public(k2)}# end\n", "mixed.pub")
    assert [k.key_id for k in mixed] == [k1.key_id, k2.key_id]
    assert list(load_trusted_keys([_pem_public(k3)])) == [k3.key_id]


def test_trusted_keys_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trusted_keys\[0\].*not found"):
        load_trusted_keys(["missing.pub"], base_dir=tmp_path)
    (tmp_path / "empty.pub").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no public key"):
        load_trusted_keys(["empty.pub"], base_dir=tmp_path)


def test_garbage_line_names_where_and_line(tmp_path: Path, rsa_pem: bytes) -> None:
    k = PrivateKey.generate()
    with pytest.raises(ConfigError, match=r"keys\.pub: line 3: .*'ssh-ed25519 AAAA'"):
        parse_public_keys(f"# c\n{k.public.line()}\nssh-ed25519 AAAA\n", "keys.pub")
    with pytest.raises(ConfigError, match=r"<inline>: line 1: not an Ed25519 public key"):
        parse_public_keys("ed25519:!!notbase64")
    short = base64.b64encode(b"x" * 31).decode()
    with pytest.raises(ConfigError, match="32 bytes"):
        parse_public_keys(f"ed25519:{short}")
    with pytest.raises(ConfigError, match="the key's id is"):
        parse_public_keys(f"ed25519:{base64.b64encode(k.public.raw).decode()} 0123456789abcdef")
    with pytest.raises(ConfigError, match="line 1: PEM block without"):
        parse_public_keys("-----BEGIN PUBLIC KEY-----\nAAAA\n")
    (tmp_path / "bad.pub").write_text("hello\n")
    with pytest.raises(ConfigError, match=r"bad\.pub: line 1"):
        load_trusted_keys([str(tmp_path / "bad.pub")])


def test_rsa_public_pem_is_refused(rsa_pem: bytes) -> None:
    from cryptography.hazmat.primitives import serialization

    rsa_pub = serialization.load_pem_private_key(rsa_pem, None).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    with pytest.raises(ConfigError, match=r"k\.pub: line 1: a RSA public key, not Ed25519"):
        parse_public_keys(rsa_pub, "k.pub")
