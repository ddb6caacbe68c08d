"""The web server under hostile clients (issue 22, part 4), on a real server with the real
pipeline: connection caps per address and in total, the header and body timeouts, uploads
refused before their body is read, failed bearer tokens throttled, live viewers that never read
dropped, cross-site streams refused, only JPEG and PNG decoded, hard links in the media folder
not served, malformed requests counted instead of logged as tracebacks, and the HTML 404 pages.
Other addresses than 127.0.0.1 are other loopback addresses (127.0.0.0/8) as source."""

from __future__ import annotations

import io
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from PIL import Image
from webclient import TOKEN, Client, ServerFactory

from edgeinfer.config.http import HttpConfig
from edgeinfer.web import WebServer

PIPELINE = "scene"


def _connect(server: WebServer, source: str = "127.0.0.1") -> socket.socket:
    port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
    return socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes (or resets) ``sock`` within ``within`` seconds."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_connections_are_capped_per_address_and_in_total(
        make_server: ServerFactory, sockets: list[socket.socket], wait_for: Any) -> None:
    server = make_server(max_connections=8, max_connections_per_client=3)
    sockets.extend(_connect(server, "127.0.0.2") for _ in range(3))
    wait_for(lambda: server.stats()["connections"]["open"] == 3, 5, "3 connections open")
    fourth = _connect(server, "127.0.0.2")
    sockets.append(fourth)
    assert _closed_by_server(fourth, 3), "a 4th connection from one address stayed open"
    assert Client(server).get("/v1/status").status == 200  # another address gets in
    # 8 in total: the next one closes the oldest idle connection and is served.
    sockets.extend(_connect(server, f"127.0.1.{i}") for i in range(5))
    wait_for(lambda: server.stats()["connections"]["open"] == 8, 5, "8 connections open")
    assert Client(server).get("/v1/status").status == 200
    assert _closed_by_server(sockets[0], 3), "the oldest idle connection was not closed"
    counts = server.stats()["connections"]
    assert counts["refused_per_client"] >= 1 and counts["evicted_idle"] >= 1
    assert counts["max"] == 8 and counts["max_per_client"] == 3


def test_default_connection_cap_follows_the_descriptor_limit(host: Any) -> None:
    import resource

    from edgeinfer.web.guard import default_max_connections

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = 1024 if soft == resource.RLIM_INFINITY else max(16, min(1024, soft // 4))
    assert default_max_connections() == expected
    server = WebServer(msgspec.convert({"port": 1}, HttpConfig), host)
    assert server.guard.max_total == expected


def test_slow_headers_and_idle_connections_are_closed(
        make_server: ServerFactory, sockets: list[socket.socket]) -> None:
    server = make_server(header_timeout_s=1.0)
    idle, slow = _connect(server), _connect(server)
    sockets.extend([idle, slow])
    started = time.monotonic()
    slow.settimeout(0.3)
    closed = False
    for byte in b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 40:
        try:
            slow.send(bytes([byte]))
            if slow.recv(1) == b"":
                closed = True
                break
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            closed = True
            break
    assert closed, "a client sending its headers a byte at a time was never closed"
    assert time.monotonic() - started < 8
    assert _closed_by_server(idle, 3), "an idle connection was never closed"
    assert server.stats()["connections"]["header_timeouts"] >= 2


def _upload_head(server: WebServer, length: int) -> bytes:
    return (f"POST /v1/infer?pipeline={PIPELINE} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: image/jpeg\r\nContent-Length: {length}\r\n\r\n").encode()


def test_uploads_beyond_the_limit_are_refused_before_their_body(
        make_server: ServerFactory, sockets: list[socket.socket]) -> None:
    server = make_server(body_timeout_s=3.0)
    length = 5 * 1024 * 1024
    for _ in range(2):  # two uploads that send only part of their body hold both slots
        sock = _connect(server)
        sockets.append(sock)
        sock.sendall(_upload_head(server, length) + b"\xff\xd8" + b"\0" * 1000)
    deadline = time.monotonic() + 5
    while server.stats()["infer_refused_busy"] == 0 and time.monotonic() < deadline:
        third = _connect(server)
        sockets.append(third)
        third.sendall(_upload_head(server, length))  # and no body at all
        third.settimeout(2)
        try:
            answer = third.recv(4096)
        except TimeoutError:
            answer = b""
        if answer.startswith(b"HTTP/1.1 429"):
            break
    assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
    # The two stalled bodies run into http.body_timeout_s: 408, and the slots are free.
    for sock in sockets[:2]:
        sock.settimeout(10)
        assert sock.recv(4096).startswith(b"HTTP/1.1 408")
    assert server.stats()["body_timeouts"] == 2
    assert Client(server).get("/v1/status").status == 200


def _image(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 100, 50)).save(out, fmt)
    return out.getvalue()


def test_only_jpeg_and_png_are_decoded(client: Client) -> None:
    url = f"/v1/infer?pipeline={PIPELINE}"
    for fmt in ("BMP", "GIF", "TIFF", "EPS"):
        r = client.call("POST", url, _image(fmt), {"Content-Type": "application/octet-stream"})
        assert r.status == 415, (fmt, r.status, r.body[:200])
        message = r.json()["error"]
        assert "JPEG or PNG" in message and "BytesIO" not in message and "0x" not in message
    ok = client.call("POST", url, _image("PNG"), {"Content-Type": "image/png"})
    assert ok.status == 200, ok.body[:300]


def test_a_hard_link_in_the_media_folder_is_not_served(
        client: Client, wait_for: Any, tmp_path: Path) -> None:
    def with_snapshot() -> list[dict[str, Any]]:
        return [e for e in client.get(f"/v1/events?pipeline={PIPELINE}").json()
                if e["snapshot_url"]]

    event = wait_for(with_snapshot, 30, "an event with a snapshot")[0]
    assert client.get(event["snapshot_url"]).status == 200
    path = Path(event["snapshot"])
    saved = tmp_path / "saved.jpg"
    shutil.copy(path, saved)
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(b"\xff\xd8 not for the web")
    link = path.with_name(path.name + ".tmp")
    os.link(secret, link)
    os.replace(link, path)  # the event's snapshot is now a hard link to a file elsewhere
    try:
        r = client.get(event["snapshot_url"])
        assert r.status == 404 and b"not for the web" not in r.body
    finally:
        shutil.copy(saved, link)
        os.replace(link, path)
    assert client.get(event["snapshot_url"]).status == 200


def test_failed_bearer_tokens_are_throttled_per_address_and_in_total(
        make_server: ServerFactory) -> None:
    per_client, total = 5, 30  # the defaults
    server = make_server(token=TOKEN)
    assert (server.config.auth_failures_per_client, server.config.auth_failures_total) == (
        per_client, total)
    good = {"Authorization": f"Bearer {TOKEN}"}
    wrong = {"Authorization": "Bearer " + "x" * 20}

    def get(source: str, headers: dict[str, str]) -> int:
        sock = _connect(server, source)
        try:
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            sock.sendall(f"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}"
                         "Connection: close\r\n\r\n".encode())
            return int(sock.recv(64).split(b" ")[1])
        finally:
            sock.close()

    for _ in range(per_client):
        assert get("127.0.0.5", wrong) == 401
    assert get("127.0.0.5", wrong) == 429
    assert get("127.0.0.5", good) == 429  # even the right token, from that address
    assert get("127.0.0.1", good) == 200  # others are not locked out by one address
    for i in range(total - per_client):  # one guess from each of many
        assert get(f"127.0.2.{i + 1}", wrong) == 401
    assert get("127.0.3.1", wrong) == 429
    assert get("127.0.3.2", good) == 429  # for the window, no token is checked at all
    assert server.stats()["auth_throttled"] >= 4


def test_the_public_login_form_is_read_only_4_kib_far(make_server: ServerFactory) -> None:
    client = Client(make_server(token=TOKEN))
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    big = client.call("POST", "/login", b"token=" + b"x" * 100_000, form)
    assert big.status == 413 and "4096 bytes" in big.json()["error"]
    assert client.call("POST", "/login", f"token={TOKEN}".encode(), form).status == 303
    assert client.call("POST", "/login", b'{"token": "x"}',
                       {"Content-Type": "application/json"}).status == 415


def test_a_viewer_that_never_reads_is_dropped(
        make_server: ServerFactory, sockets: list[socket.socket], wait_for: Any) -> None:
    server = make_server(live_fps=30, live_quality=100, max_viewers=1, live_stall_s=1.0)
    client = Client(server)
    port = int(server.url.rsplit(":", 1)[1].rstrip("/"))
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", port))
    sockets.append(stuck)
    stuck.sendall(f"GET /v1/pipelines/{PIPELINE}/live.mjpg HTTP/1.1\r\n"
                  "Host: 127.0.0.1\r\n\r\n".encode())
    wait_for(lambda: server.stats()["viewers"] == 1, 10, "the viewer joining")
    wait_for(lambda: server.stats()["viewers_dropped_stalled"] == 1, 40,
             "the stalled viewer being dropped")
    wait_for(lambda: server.stats()["viewers"] == 0, 5, "the slot freeing")
    conn = client.connect()
    try:
        conn.request("GET", f"/v1/pipelines/{PIPELINE}/live.mjpg")
        assert conn.getresponse().status == 200  # the slot is free again
    finally:
        conn.close()


def _status(client: Client, path: str, headers: dict[str, str]) -> int:
    """The status of ``GET path``, without reading the (maybe endless) body."""
    conn = client.connect(timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def test_cross_site_stream_is_refused(client: Client) -> None:
    url = f"/v1/pipelines/{PIPELINE}/live.mjpg"
    assert _status(client, url, {"Sec-Fetch-Site": "cross-site"}) == 403
    assert _status(client, url, {"Origin": "http://evil.example"}) == 403
    assert client.get("/v1/status", {"Sec-Fetch-Site": "cross-site"}).status == 403
    assert client.get("/v1/status", {"Sec-Fetch-Site": "same-origin"}).status == 200
    assert client.get("/", {"Sec-Fetch-Site": "cross-site"}).status in (200, 404)  # a link


def test_malformed_requests_and_abandoned_uploads_are_counted_not_logged(
        server: WebServer, caplog: pytest.LogCaptureFixture, wait_for: Any) -> None:
    caplog.set_level(logging.DEBUG)
    bad = [b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",
           b"GET / HTTP/9.9\r\nHost: 127.0.0.1\r\n\r\n",
           b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n"] * 20
    for raw in bad:
        sock = _connect(server)
        sock.sendall(raw)
        sock.settimeout(5)
        assert sock.recv(64)[8:13] == b" 400 "
        sock.close()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING
            and r.name.split(".")[0] in ("aiohttp", "edgeinfer")]
    assert not loud, [r.getMessage() for r in loud][:3]
    for _ in range(5):  # uploads abandoned half way
        sock = _connect(server)
        sock.sendall(_upload_head(server, 100_000) + b"\xff\xd8" + b"\0" * 5000)
        sock.close()
    wait_for(lambda: server.stats()["client_gone"] + server.stats()["infer_refused_busy"] == 5,
             10, "the abandoned uploads counted")
    assert server.stats()["client_gone"] >= 1
    assert server.stats()["connections"]["server_errors_logged_at_debug"] >= len(bad)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING
            and r.name.split(".")[0] in ("aiohttp", "edgeinfer")]
    assert not loud, [r.getMessage() for r in loud][:3]
    debug = [r for r in caplog.records if r.name == "edgeinfer.web.guard"]
    assert 1 <= len(debug) <= 10  # rate-limited: about one a second


def test_unknown_pages_are_html_404s(client: Client) -> None:
    for path in ("/live/nope", "/no/such/page"):
        r = client.get(path)
        assert r.status == 404 and r.headers["Content-Type"].startswith("text/html"), path
        assert b"<h1>Not found</h1>" in r.body
    assert b"nope" in client.get("/live/nope").body
    api = client.get("/v1/nothing")
    assert api.status == 404 and api.headers["Content-Type"].startswith("application/json")


def test_a_short_token_is_a_plain_config_error() -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.convert({"token": "short"}, HttpConfig)
    message = str(info.value)
    assert "16 to 512" in message and "[\\x21" not in message and "short" not in message
