"""A real mosquitto broker on a free loopback port, for tests and smoke checks.

    with Mosquitto() as broker:
        client.connect(broker.host, broker.port)

    with Mosquitto(users={"dev": "s3cret"}, acl="user dev\\ntopic write edgeinfer/#\\n",
                   tls=True, require_certificate=True) as broker:
        ...  # broker.ca_file, broker.client_cert_file, broker.client_key_file

Each broker gets its own config file and data folder (no persistence unless asked), so tests
never share state with a broker the machine already runs. ``kill()`` (SIGKILL, as a crash) and
``start()`` bring it back on the same port; with ``persistence=True`` retained messages and
persistent sessions saved before the kill survive it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Self

from .._net import free_port
from .procs import stop_process

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["Mosquitto", "TestCA", "free_port"]


class TestCA:
    """A throw-away certificate authority (EC P-256) writing PEM files into ``folder``.

    Args:
        folder: Where the CA's and every issued certificate's files go.
        name: Common name of the CA; also the file stem (``<name>.crt``, ``<name>.key``).
    """

    __test__ = False  # not a pytest test class

    def __init__(self, folder: str | Path, name: str = "edgeinfer-test-ca") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec

        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)])
        builder = self._builder(subject, subject, self._key.public_key())
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, encipher_only=False,
                          decipher_only=False), critical=True)
        self._cert = self._sign(builder)
        self.cert_file, self.key_file = self._write(name, self._cert, self._key)

    def issue(self, name: str, *, hosts: Iterable[str] = (), client: bool = False) -> tuple[Path, Path]:
        """Issue a leaf certificate; returns ``(cert_file, key_file)``.

        Args:
            name: Common name and file stem.
            hosts: DNS names and IP addresses for the subject alternative names (servers).
            client: For client authentication instead of a server.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, name)])
        builder = self._builder(subject, self._cert.subject, key.public_key())
        builder = builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        from cryptography.x509.oid import ExtendedKeyUsageOID

        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return self._write(name, self._sign(builder), key)

    def _builder(self, subject: x509.Name, issuer: x509.Name,
                 public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
        from cryptography import x509

        now = dt.datetime.now(dt.UTC)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=2))
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))

    def _sign(self, builder: x509.CertificateBuilder) -> x509.Certificate:
        from cryptography.hazmat.primitives import hashes

        return builder.sign(self._key, hashes.SHA256())

    def _write(self, name: str, cert: x509.Certificate,
               key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
        from cryptography.hazmat.primitives import serialization

        cert_file, key_file = self.folder / f"{name}.crt", self.folder / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        key_file.chmod(0o600)
        return cert_file, key_file


class Mosquitto:
    """Start ``mosquitto -c <generated config>``; stop it on exit.

    Args:
        extra_config: more lines for the config, written after everything else.
        port: a fixed port (default: a free one), e.g. to restart on the same port.
        binary: the mosquitto executable (default: found on PATH or in /usr/sbin).
        users: ``{name: password}``: a password file (``mosquitto_passwd -b``); anonymous
            clients are then refused.
        acl: the text of an ACL file (``user NAME`` / ``topic read|write|readwrite FILTER``).
        tls: serve TLS with a generated test CA (`ca_file`) and a server certificate for
            ``tls_hosts``; a client certificate is issued too (`client_cert_file`,
            `client_key_file`).
        tls_hosts: the names the server certificate holds.
        tls_version: ``tlsv1.2`` or ``tlsv1.3`` to allow only that version.
        require_certificate: clients must present a certificate signed by the test CA.
        persistence: keep retained messages and persistent sessions on disk (saved every
            ``autosave_interval_s``), so that they survive ``kill()`` and ``start()``.
        autosave_interval_s: how often the persistence file is written.
        persistence_folder: where the persistence file goes (default: the broker's own folder).
            mosquitto fsyncs every save, so a test that saves often on a box whose disk is busy
            puts it on a tmpfs (``/dev/shm``): it outlives ``kill()`` all the same.
    """

    def __init__(self, extra_config: str = "", port: int | None = None,
                 binary: str | None = None, *, users: Mapping[str, str] | None = None,
                 acl: str | None = None, tls: bool = False,
                 tls_hosts: Iterable[str] = ("localhost", "127.0.0.1"),
                 tls_version: str | None = None, require_certificate: bool = False,
                 persistence: bool = False, autosave_interval_s: int = 1,
                 persistence_folder: str | Path | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.binary = binary or shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self._extra = extra_config
        self._users = dict(users or {})
        self._acl = acl
        self.tls = tls
        self._tls_hosts = tuple(tls_hosts)
        self._tls_version = tls_version
        self._require_certificate = require_certificate
        self._persistence = persistence
        self._autosave = autosave_interval_s
        self._persistence_folder = persistence_folder
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.ca: TestCA | None = None
        self.ca_file: Path | None = None
        self.client_cert_file: Path | None = None
        self.client_key_file: Path | None = None
        self._server_cert: tuple[Path, Path] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def folder(self) -> Path:
        """The broker's own folder (config, password and ACL files, certificates, log)."""
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="edgeinfer-mosquitto-")
        return Path(self._dir.name)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log(self) -> str:
        """What the broker wrote to its log so far."""
        path = self.folder / "log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout_s: float = 10.0) -> None:
        folder = self.folder
        conf = folder / "mosquitto.conf"
        conf.write_text(self._config(folder))
        self._proc = subprocess.Popen([self.binary, "-c", str(conf)], stdout=subprocess.DEVNULL,
                                      stderr=open(folder / "log", "ab"))  # noqa: SIM115
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                log = self.log[-2000:]
                raise RuntimeError(f"mosquitto exited with {self._proc.returncode}: {log}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"mosquitto did not listen on {self.address} within {timeout_s} s")

    def _config(self, folder: Path) -> str:
        lines = [f"listener {self.port} {self.host}",
                 f"allow_anonymous {'false' if self._users else 'true'}",
                 f"persistence_location {self._persistence_folder or folder}/",
                 "log_dest stderr",
                 "log_type error", "log_type warning", "log_type notice", "log_type information",
                 # mosquitto's default (1000 queued per client) drops QoS 1 messages for a
                 # subscriber that lags, as a test's can on a loaded machine: not what is tested.
                 "max_queued_messages 1000000"]
        if os.geteuid() == 0:
            # As root mosquitto would switch to the `mosquitto` user, which cannot read this
            # private folder (keys, password file) nor write its persistence file there.
            lines.append("user root")
        if self._persistence:
            lines += ["persistence true", f"autosave_interval {self._autosave}"]
        if self._users:
            lines.append(f"password_file {self._password_file(folder)}")
        if self._acl is not None:
            acl_file = folder / "acl"
            acl_file.write_text(self._acl)
            lines.append(f"acl_file {acl_file}")
        if self.tls:
            cert, key = self._certificates(folder)
            lines += [f"cafile {self.ca_file}", f"certfile {cert}", f"keyfile {key}"]
            if self._tls_version:
                lines.append(f"tls_version {self._tls_version}")
            if self._require_certificate:
                lines.append("require_certificate true")
        return "\n".join(lines) + f"\n{self._extra}\n"

    def _password_file(self, folder: Path) -> Path:
        path = folder / "passwd"
        if not path.exists():
            tool = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
            path.touch(mode=0o600)
            for name, password in self._users.items():
                subprocess.run([tool, "-b", str(path), name, password], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        return path

    def _certificates(self, folder: Path) -> tuple[Path, Path]:
        if self._server_cert is None:
            self.ca = TestCA(folder / "pki")
            self.ca_file = self.ca.cert_file
            self._server_cert = self.ca.issue("server", hosts=self._tls_hosts)
            self.client_cert_file, self.client_key_file = self.ca.issue("client", client=True)
        return self._server_cert

    def wait_saved(self, timeout_s: float = 10.0) -> None:
        """With ``persistence``: wait until the broker has written its database after this call
        (mosquitto saves every ``autosave_interval_s``, rounded up to whole seconds), so that
        what it holds now survives a ``kill()``."""
        if not self._persistence:
            raise RuntimeError("wait_saved() needs Mosquitto(persistence=True)")
        since = time.time()
        db = Path(self._persistence_folder or self.folder) / "mosquitto.db"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if db.exists() and db.stat().st_mtime >= since:
                return
            time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not save {db} within {timeout_s} s")

    def stop(self, kill: bool = False) -> None:
        """Stop the broker (``kill=True``: SIGKILL, as a crash); ``start()`` brings it back."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_process(proc, 5, kill=kill)

    def kill(self) -> None:
        """SIGKILL the broker, as a crash; ``start()`` brings it back on the same port."""
        self.stop(kill=True)

    def restart(self, *, kill: bool = False, timeout_s: float = 10.0) -> None:
        """Stop (or kill) and start again on the same port, with the same files."""
        self.stop(kill=kill)
        self.start(timeout_s)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
