"""Typed config of the ``http:`` section: the daemon's local web view and REST API (off unless
the section is there). Field names are a contract (``docs/web.md``)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from msgspec import Meta

from ._types import ConfigStruct, FilePath, Fps, Host, MiB, Port

__all__ = ["HttpConfig", "HttpTlsConfig", "is_loopback"]

_TOKEN = re.compile(r"[\x21-\x7e]{16,512}")


class HttpTlsConfig(ConfigStruct, frozen=True):
    """HTTPS with a certificate of your own.

    Attributes:
        cert_file: The server's certificate chain (PEM).
        key_file: Its private key (PEM).
    """

    cert_file: FilePath
    key_file: FilePath


class HttpConfig(ConfigStruct, frozen=True):
    """The web view and REST API.

    Attributes:
        bind: Address to listen on. Loopback (``127.0.0.1``, ``::1``, ``localhost``) by default;
            any other address needs a ``token``.
        port: TCP port.
        token: The secret a client shows (``Authorization: Bearer <token>``, or once on the
            login page, which sets a cookie). 16 to 512 printable characters; best given as
            ``${credential:http_token}``. Required unless ``bind`` is loopback; when set it is
            required on loopback too.
        tls: Serve HTTPS with this certificate (``None``: plain HTTP).
        live_fps: Most frames per second a live view sends to one viewer.
        live_quality: JPEG quality of live frames.
        max_viewers: Live views served at once (more get 503).
        max_upload_mb: Largest image ``POST /v1/infer`` takes.
        max_pixels: Largest decoded image (width times height) it takes.
        allowed_hosts: Host names (besides the bound address and loopback names) the server
            answers to; a request naming another ``Host`` is refused (DNS rebinding).
        max_connections: Connections open at once, in total (``None``: a quarter of the
            process's descriptor limit, 16 to 1024). At the limit the oldest idle one is closed;
            when none is idle a new one is refused.
        max_connections_per_client: Connections open at once from one address (more are
            refused).
        header_timeout_s: A connection that has not sent a whole request head this long after
            it opened or after its last answer is closed (idle keep-alive, slowloris).
        max_header_bytes: Largest request head (request line and headers) one connection may
            send; a larger one is answered 431 and closed. One header line is also capped at
            this or 8190 bytes, whichever is smaller.
        max_header_bytes_per_client: Most bytes of request heads not yet complete that the
            connections from one address may hold together; past it that address's oldest
            half-sent head is closed (431).
        max_header_bytes_total: The same for all connections together; past it the oldest
            half-sent head of any address is closed (503), so a new request gets room. Each
            of the three applies at most the next (``/v1/status`` shows the values in force).
        body_timeout_s: Longest time a client may take to send a request body (408 beyond).
        live_stall_s: A live viewer whose connection takes no frame for this long is dropped.
        auth_failures_per_client: Failed token checks (wrong bearer token or login) one address
            may make in a minute; then tokens from it are not checked (429) until the minute
            has room.
        auth_failures_total: The same for all addresses together.
    """

    bind: Host = "127.0.0.1"
    port: Port = 8080
    token: str | None = None
    tls: HttpTlsConfig | None = None
    live_fps: Fps = 5.0
    live_quality: Annotated[int, Meta(ge=10, le=100)] = 70
    max_viewers: Annotated[int, Meta(ge=1, le=64)] = 4
    max_upload_mb: MiB = 10.0
    max_pixels: Annotated[int, Meta(ge=1024, le=100_000_000)] = 20_000_000
    allowed_hosts: Annotated[list[Host], Meta(max_length=32)] = []
    max_connections: Annotated[int, Meta(ge=4, le=65536)] | None = None
    max_connections_per_client: Annotated[int, Meta(ge=1, le=65536)] = 32
    header_timeout_s: Annotated[float, Meta(ge=0.5, le=3600)] = 10.0
    max_header_bytes: Annotated[int, Meta(ge=1024, le=1 << 20)] = 32 << 10
    max_header_bytes_per_client: Annotated[int, Meta(ge=1024, le=1 << 30)] = 1 << 20
    max_header_bytes_total: Annotated[int, Meta(ge=1024, le=1 << 30)] = 4 << 20
    body_timeout_s: Annotated[float, Meta(ge=0.5, le=3600)] = 60.0
    live_stall_s: Annotated[float, Meta(ge=0.5, le=3600)] = 10.0
    auth_failures_per_client: Annotated[int, Meta(ge=1, le=100_000)] = 5
    auth_failures_total: Annotated[int, Meta(ge=1, le=100_000)] = 30

    def __post_init__(self) -> None:
        if self.token is not None and _TOKEN.fullmatch(self.token) is None:
            raise ValueError(f"http.token must be 16 to 512 printable ASCII characters without "
                             f"spaces (this one has {len(self.token)} characters); make one "
                             "with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")
        if not is_loopback(self.bind) and self.token is None:
            raise ValueError(f"binding {self.bind} (not loopback) needs a token "
                             "(e.g. token: ${credential:http_token})")


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or ``localhost``."""
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
