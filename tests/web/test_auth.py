"""Who may use the web server: token (bearer or login cookie), CSRF, cross-site POSTs, the Host
header (DNS rebinding), failed-login limits and TLS; real server, real HTTP on loopback."""

from __future__ import annotations

import ssl
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.testing.mosquitto import TestCA

TOKEN = "s3cret-token-for-tests-0123"
PIPELINE = "scene"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def locked(make_server: Any, client_of: Any) -> Any:
    """A client of a server with a token."""
    return client_of(make_server(token=TOKEN))


def _login(client: Any, token: str = TOKEN, headers: dict[str, str] | None = None) -> Any:
    return client.call("POST", "/login", f"token={token}".encode(), {**FORM, **(headers or {})})


def _cookies(reply: Any) -> dict[str, Any]:
    jar: SimpleCookie = SimpleCookie()
    for value in reply.headers.get_all("Set-Cookie") or []:
        jar.load(value)
    return dict(jar)


def test_without_a_token_the_api_is_open_but_cross_site_posts_are_refused(client: Any) -> None:
    assert client.get("/v1/status").status == 200
    own = f"http://{client.host}:{client.port}"
    ok = client.post_json("/v1/commands/status", {}, {"Origin": own})
    assert ok.status == 200
    evil = client.post_json("/v1/commands/status", {}, {"Origin": "http://evil.example"})
    assert evil.status == 403 and "cross-site" in evil.json()["error"]
    fetch = client.post_json("/v1/commands/status", {}, {"Sec-Fetch-Site": "cross-site"})
    assert fetch.status == 403
    upload = client.call("POST", f"/v1/infer?pipeline={PIPELINE}", b"x",
                         {"Content-Type": "multipart/form-data; boundary=x",
                          "Origin": "null"})
    assert upload.status == 403
    assert client.call("POST", "/login", b"token=x", FORM).status == 400  # no token: no login


def test_host_header_must_name_this_server(make_server: Any, client_of: Any) -> None:
    client = client_of(make_server(allowed_hosts=["camera.local"]))
    for host in ("localhost:1", "127.0.0.1", "camera.local:8080", "[::1]:80"):
        assert client.get("/v1/status", {"Host": host}).status == 200, host
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", ""):
        r = client.get("/v1/status", {"Host": host})
        assert r.status == 421, host
        assert "allowed_hosts" in r.json()["error"]


def test_token_required(locked: Any) -> None:
    r = locked.get("/v1/status")
    assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert "Bearer" in r.json()["error"]
    assert locked.get("/v1/pipelines/scene/live.mjpg").status == 401
    page = locked.get("/")
    assert page.status == 303 and page.headers["Location"] == "/login"
    assert locked.post_json("/v1/commands/status", {}).status == 401
    wrong = locked.get("/v1/status", {"Authorization": "Bearer not-the-token-at-all"})
    assert wrong.status == 401
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert locked.get("/v1/status", bearer).status == 200
    # A bearer needs no CSRF header: a browser never sends it on its own.
    assert locked.post_json("/v1/commands/status", {}, bearer).status == 200
    # Public: the login form, the assets, the API document.
    assert locked.get("/login").status == 200
    assert locked.get("/openapi.json").status == 200
    assert locked.get("/static/nothing.css").status == 404


def test_login_cookie_and_csrf(locked: Any) -> None:
    wrong = _login(locked, "wrong-token-wrong-token")
    assert wrong.status == 401 and not _cookies(wrong)
    r = _login(locked)
    assert r.status == 303 and r.headers["Location"] == "/"
    cookies = _cookies(r)
    session, csrf = cookies["edgeinfer_session"], cookies["edgeinfer_csrf"]
    assert session["httponly"] and session["samesite"] == "Strict" and session["path"] == "/"
    assert not session["secure"]  # plain HTTP; see the TLS test
    assert not csrf["httponly"]  # the page reads it
    assert int(session["max-age"]) == 12 * 3600
    cookie = {"Cookie": f"edgeinfer_session={session.value}; edgeinfer_csrf={csrf.value}"}
    assert locked.get("/v1/status", cookie).status == 200
    info = locked.get("/v1/session", cookie).json()
    assert info["auth"] == "cookie" and info["csrf"] == csrf.value
    missing = locked.post_json("/v1/commands/status", {}, cookie)
    assert missing.status == 403 and "X-Edgeinfer-CSRF" in missing.json()["error"]
    bad = locked.post_json("/v1/commands/status", {}, {**cookie, "X-Edgeinfer-CSRF": "nope"})
    assert bad.status == 403
    good = {**cookie, "X-Edgeinfer-CSRF": csrf.value}
    assert locked.post_json("/v1/commands/status", {}, good).status == 200
    evil = locked.post_json("/v1/commands/status", {}, {**good, "Origin": "http://evil.example"})
    assert evil.status == 403
    forged = {"Cookie": "edgeinfer_session=made-up"}
    assert locked.get("/v1/status", forged).status == 401
    out = locked.call("POST", "/logout", b"", good)
    assert out.status == 303
    assert locked.get("/v1/status", cookie).status == 401  # the session is gone server-side


def test_failed_logins_are_limited(locked: Any) -> None:
    for _ in range(5):
        assert _login(locked, "x" * 20).status == 401
    r = _login(locked, "x" * 20)
    assert r.status == 429 and r.headers["Retry-After"]
    assert _login(locked).status == 429  # even the right token, for the minute


def test_cross_site_login_is_refused(locked: Any) -> None:
    assert _login(locked, headers={"Origin": "http://evil.example"}).status == 403


def test_tls(make_server: Any, client_of: Any, tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    cert, key = ca.issue("web", hosts=["127.0.0.1", "localhost"])
    server = make_server(token=TOKEN, tls={"cert_file": str(cert), "key_file": str(key)})
    assert server.url.startswith("https://127.0.0.1:")
    context = ssl.create_default_context(cafile=str(ca.cert_file))
    client = client_of(server, context)
    assert client.get("/v1/status").status == 401
    assert client.get("/v1/status", {"Authorization": f"Bearer {TOKEN}"}).status == 200
    session = _cookies(_login(client))["edgeinfer_session"]
    assert session["secure"]
    with pytest.raises(ssl.SSLError):  # a client that does not trust the certificate
        client_of(server, ssl.create_default_context()).get("/v1/status")


def test_unloadable_certificate_is_a_config_error(make_server: Any, tmp_path: Path) -> None:
    from edgeinfer.errors import ConfigError

    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError, match="http.tls"):
        make_server(tls={"cert_file": str(bad), "key_file": str(bad)})
