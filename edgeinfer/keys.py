"""Ed25519 keys for signed model updates and signed commands: generation, loading, trusted
public keys (used by ``ota/``, ``control/``, the config's start checks and ``edgeinfer keygen``).

A public key travels as one line, ``ed25519:<base64 of the 32 raw bytes> <key id>``, where the
key id is the first 16 hex digits of the sha256 of the raw bytes (``docs/ota.md``). Private keys
are PKCS#8 PEM files, unencrypted, mode 0600. ``cryptography`` is imported only when a key is
actually made, loaded or used.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from ._durable import write_atomic, write_new

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "PrivateKey",
    "PublicKey",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_trusted_keys",
    "parse_public_keys",
]

logger = logging.getLogger("edgeinfer.ota.keys")  # its name before it moved; users filter on it

_PREFIX = "ed25519:"
_PEM_BEGIN = "-----BEGIN PUBLIC KEY-----"
_PEM_END = "-----END PUBLIC KEY-----"


def key_id(raw: bytes) -> str:
    """The id of a public key: the first 16 hex digits of sha256 of its 32 raw bytes."""
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class PublicKey:
    """An Ed25519 public key and its id.

    Attributes:
        key_id: ``key_id(raw)``.
        raw: the 32 raw public-key bytes.
    """

    key_id: str
    raw: bytes

    @classmethod
    def from_raw(cls, raw: bytes) -> PublicKey:
        """The key of 32 raw bytes; ``ValueError`` for another length."""
        if len(raw) != 32:
            raise ValueError(f"an Ed25519 public key is 32 bytes, not {len(raw)}")
        return cls(key_id=key_id(raw), raw=bytes(raw))

    def verify(self, data: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is this key's Ed25519 signature of ``data`` (never raises for a
        bad or malformed signature)."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(bytes(signature), bytes(data))
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True

    def line(self) -> str:
        """The ``ed25519:<base64 raw> <key id>`` line of a ``.pub`` file or a config entry."""
        return f"{_PREFIX}{base64.b64encode(self.raw).decode('ascii')} {self.key_id}"


class PrivateKey:
    """An Ed25519 private key that signs updates; ``public`` is its public half."""

    __slots__ = ("_key", "key_id", "public")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        from cryptography.hazmat.primitives import serialization

        self._key = key
        raw = key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self.public = PublicKey.from_raw(raw)
        self.key_id = self.public.key_id

    @classmethod
    def generate(cls) -> PrivateKey:
        """A new random key (not written anywhere)."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate())

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        return self._key.sign(bytes(data))

    def pem(self) -> bytes:
        """The key as unencrypted PKCS#8 PEM."""
        from cryptography.hazmat.primitives import serialization

        return self._key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def __repr__(self) -> str:
        return f"PrivateKey(key_id={self.key_id!r})"


# -- files -----------------------------------------------------------------------------------
def generate_keypair(out: str | os.PathLike[str], *, force: bool = False) -> tuple[Path, Path, str]:
    """Write a new key pair: ``out`` (PKCS#8 PEM, mode 0600) and ``out.pub`` (one line).

    Args:
        out: the private key's path; the public key goes next to it with ``.pub`` appended.
        force: replace existing files (atomically) instead of refusing.

    Returns:
        ``(private path, public path, key id)``.

    Raises:
        ConfigError: a file exists and ``force`` is off, or a file cannot be written.
    """
    priv_path = Path(out)
    pub_path = priv_path.with_name(priv_path.name + ".pub")
    if not force:
        existing = [str(p) for p in (priv_path, pub_path) if os.path.lexists(p)]
        if existing:
            raise ConfigError(
                f"{' and '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; "
                "pass --force to replace"
            )
    key = PrivateKey.generate()
    pub_text = (key.public.line() + "\n").encode("ascii")
    try:
        if force:
            write_atomic(priv_path, key.pem(), 0o600)
            write_atomic(pub_path, pub_text, 0o644)
        else:
            write_new(priv_path, key.pem(), 0o600)
            try:
                write_new(pub_path, pub_text, 0o644)
            except BaseException:
                priv_path.unlink(missing_ok=True)
                raise
    except FileExistsError as exc:
        raise ConfigError(f"{exc.filename} already exists; pass --force to replace") from None
    except OSError as exc:
        raise ConfigError(f"cannot write key file {exc.filename or priv_path}: {exc.strerror}") from exc
    return priv_path, pub_path, key.key_id


def load_private_key(path: str | os.PathLike[str]) -> PrivateKey:
    """Load an Ed25519 private key from a PKCS#8 PEM file written by ``generate_keypair``.

    Logs a warning when the file can be read by its group or by everyone.

    Raises:
        ConfigError: missing or unreadable file, a public key, an encrypted key, or a key that
            is not Ed25519.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    p = Path(path)
    try:
        st = p.stat()
        data = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"private key file not found: {p}") from None
    except IsADirectoryError:
        raise ConfigError(f"private key path {p} is a directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot read private key file {p}: {exc.strerror}") from None
    text = data.decode("ascii", "replace")
    # A public key first: it is readable by everyone on purpose, so no chmod hint for it.
    if text.lstrip().startswith(_PREFIX) or _PEM_BEGIN in text:
        raise ConfigError(f"{p} is a public key; --key takes the private key (the file without "
                          ".pub that `edgeinfer keygen` wrote next to it)")
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        logger.warning("private key %s is readable by group or others (mode %o); chmod 600 it",
                       p, stat.S_IMODE(st.st_mode))
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(f"{p}: the private key is encrypted; edgeinfer needs an unencrypted "
                          "PKCS#8 Ed25519 key (edgeinfer keygen writes one)") from None
    except ValueError as exc:
        raise ConfigError(f"{p} is not a PEM private key ({exc}); edgeinfer keygen writes one") from None
    except Exception as exc:  # cryptography raises UnsupportedAlgorithm for exotic keys
        raise ConfigError(f"{p}: cannot load the private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"{p} holds a {_algorithm_name(key)} key, not Ed25519; create one with edgeinfer keygen"
        )
    return PrivateKey(key)


def _algorithm_name(key: Any) -> str:
    name = type(key).__name__
    for suffix in ("PrivateKey", "PublicKey"):
        name = name.removeprefix("_").removesuffix(suffix)
    return name or "different"


# -- trusted public keys ---------------------------------------------------------------------
def parse_public_keys(text: str, where: str = "<inline>") -> list[PublicKey]:
    """The public keys in ``text``: ``ed25519:<base64> [comment]`` lines (blank lines and ``#``
    comments skipped) and/or PEM ``PUBLIC KEY`` blocks holding Ed25519 keys.

    A comment that looks like a key id (16 hex digits) must be the key's id.

    Raises:
        ConfigError: a line or block that is not an Ed25519 public key; the message names
            ``where`` and the line number.
    """
    keys: list[PublicKey] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, line = i + 1, lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        if line == _PEM_BEGIN:
            block = [line]
            while i < len(lines) and lines[i].strip() != _PEM_END:
                block.append(lines[i].strip())
                i += 1
            if i >= len(lines):
                raise ConfigError(f"{where}: line {lineno}: PEM block without {_PEM_END}")
            block.append(_PEM_END)
            i += 1
            keys.append(_parse_pem("\n".join(block) + "\n", f"{where}: line {lineno}"))
            continue
        keys.append(_parse_line(line, f"{where}: line {lineno}"))
    return keys


def _parse_line(line: str, where: str) -> PublicKey:
    shown = line if len(line) <= 80 else line[:77] + "..."
    if not line.startswith(_PREFIX):
        raise ConfigError(f"{where}: expected 'ed25519:<base64> [comment]' or a PEM public key, "
                          f"got {shown!r}")
    b64, _, comment = line[len(_PREFIX):].partition(" ")
    try:
        key = PublicKey.from_raw(base64.b64decode(b64, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{where}: not an Ed25519 public key ({exc}): {shown!r}") from None
    comment = comment.strip()
    if len(comment) == 16 and all(c in "0123456789abcdef" for c in comment) and comment != key.key_id:
        raise ConfigError(f"{where}: the key's id is {key.key_id}, but the line says {comment}")
    return key


def _parse_pem(pem: str, where: str) -> PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(pem.encode("ascii", "replace"))
    except Exception as exc:  # ValueError, UnsupportedAlgorithm
        raise ConfigError(f"{where}: not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ConfigError(f"{where}: a {_algorithm_name(key)} public key, not Ed25519")
    return PublicKey.from_raw(
        key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )


def load_trusted_keys(entries: Sequence[str], base_dir: Path | None = None) -> dict[str, PublicKey]:
    """The keys ``ota.trusted_keys`` names, by key id.

    Args:
        entries: each an inline ``ed25519:...`` line (or PEM text), or the path of a file of
            such lines or a PEM public key; a relative path is taken from ``base_dir``.
        base_dir: the folder relative paths start from (the config file's); default the
            working directory.

    Raises:
        ConfigError: an unreadable file, or text that is not a public key.
    """
    trusted: dict[str, PublicKey] = {}
    for n, entry in enumerate(entries):
        entry = entry.strip()
        if entry.startswith(_PREFIX) or entry.startswith(_PEM_BEGIN):
            keys = parse_public_keys(entry, f"ota.trusted_keys[{n}]")
        else:
            path = Path(entry).expanduser()
            if base_dir is not None and not path.is_absolute():
                path = base_dir / path
            try:
                text = path.read_text("utf-8")
            except FileNotFoundError:
                raise ConfigError(f"ota.trusted_keys[{n}]: key file not found: {path}") from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"ota.trusted_keys[{n}]: cannot read key file {path}: {exc}") from None
            keys = parse_public_keys(text, str(path))
            if not keys:
                raise ConfigError(f"ota.trusted_keys[{n}]: {path} holds no public key")
        for key in keys:
            trusted[key.key_id] = key
    return trusted
