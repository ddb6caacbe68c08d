"""Who may talk to the web server, and from where.

Checks run in this order on every request (`security_middleware`):

1. ``Host`` must name the bound address, a loopback name or one of ``allowed_hosts`` (a page
   on another site that rebinds its DNS name to this device is answered 421).
2. A ``POST`` (or a ``GET`` of the API, the live stream included) whose ``Origin`` names
   another origin, or with ``Sec-Fetch-Site: cross-site``, is refused (403) with or without a
   token: this guards the loopback no-token mode against a malicious page the local user
   visits (it could otherwise hold every live view slot).
3. With a ``token``: every route but ``/login``, ``/static/*`` and ``GET /openapi.json`` needs
   ``Authorization: Bearer <token>`` or the session cookie a successful ``POST /login`` set. A
   ``POST`` that relies on the cookie must carry ``X-Edgeinfer-CSRF`` equal to the session's
   CSRF token (the readable ``edgeinfer_csrf`` cookie, or ``GET /v1/session``).
4. Failed token checks (a wrong bearer token or a wrong login) are limited: after
   ``http.auth_failures_per_client`` in ``FAILURE_WINDOW_S`` from one address, or
   ``http.auth_failures_total`` from all addresses together, tokens are not checked at all
   (429) until the window has room. A logged-in browser's session cookie still works then.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from ..config.http import HttpConfig, is_loopback

__all__ = ["Auth", "CSRF_COOKIE", "CSRF_HEADER", "SESSION_COOKIE", "Session"]

SESSION_COOKIE = "edgeinfer_session"
CSRF_COOKIE = "edgeinfer_csrf"
CSRF_HEADER = "X-Edgeinfer-CSRF"
SESSION_S = 12 * 3600
MAX_SESSIONS = 64
FAILURE_WINDOW_S = 60.0
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
_PUBLIC = ("/login", "/static/")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class Session:
    """A logged-in browser.

    Attributes:
        csrf: The token its state-changing requests carry in ``X-Edgeinfer-CSRF``.
        expires: ``time.monotonic()`` after which it is void.
    """

    csrf: str
    expires: float


class Auth:
    """Token, login sessions, failed-login limits and the request checks.

    Args:
        config: The ``http:`` section.
    """

    def __init__(self, config: HttpConfig) -> None:
        self.config = config
        self.token = config.token
        self.secure = config.tls is not None
        self._sessions: dict[str, Session] = {}
        self._failures: dict[str, deque[float]] = {}
        self.per_client, self.total = config.auth_failures_per_client, config.auth_failures_total
        self._all_failures: deque[float] = deque(maxlen=self.total)
        self.throttled_count = 0
        hosts = {config.bind.lower().strip("[]"), *_LOOPBACK_NAMES}
        hosts.update(h.lower().strip("[]") for h in config.allowed_hosts)
        self.hosts = frozenset(hosts)

    # -- checks ---------------------------------------------------------------------------------
    def host_allowed(self, header: str | None) -> bool:
        """Whether a ``Host`` header names this server (port ignored)."""
        if not header:
            return False
        name = header.strip().lower()
        if name.startswith("["):
            name = name[1:].split("]", 1)[0]
        elif name.count(":") == 1:
            name = name.split(":", 1)[0]
        name = name.rstrip(".")
        return name in self.hosts or (name != "" and is_loopback(name) and is_loopback(
            self.config.bind))

    def cross_site(self, request: web.Request) -> bool:
        """Whether a request says it comes from a page of another site."""
        if request.headers.get("Sec-Fetch-Site", "").lower() == "cross-site":
            return True
        origin = request.headers.get("Origin")
        if origin is None:
            return False
        own = f"{request.scheme}://{request.host}".lower()
        return origin.lower().rstrip("/") != own

    def bearer_ok(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or self.token is None:
            return False
        return hmac.compare_digest(given.strip().encode(), self.token.encode())

    def _has_bearer(self, request: web.Request) -> bool:
        return request.headers.get("Authorization", "").lower().startswith("bearer")

    def session(self, request: web.Request) -> Session | None:
        """The live session the request's cookie names, if any."""
        sid = request.cookies.get(SESSION_COOKIE)
        if not sid:
            return None
        found = self._sessions.get(sid)
        if found is None:
            return None
        if found.expires < time.monotonic():
            del self._sessions[sid]
            return None
        return found

    # -- login ----------------------------------------------------------------------------------
    def throttled(self, client: str) -> bool:
        """Whether ``client``, or all clients together, failed too many token checks lately."""
        cutoff = time.monotonic() - FAILURE_WINDOW_S
        every = self._all_failures
        while every and every[0] < cutoff:
            every.popleft()
        if len(every) >= self.total:
            return True
        recent = self._failures.get(client)
        if recent is None:
            return False
        while recent and recent[0] < cutoff:
            recent.popleft()
        return len(recent) >= self.per_client

    def throttle_refusal(self, client: str) -> web.Response | None:
        """The 429 answer when ``client`` may not try a token now (counted), else ``None``."""
        if not self.throttled(client):
            return None
        self.throttled_count += 1
        return error(429, "too many failed token checks (wrong bearer token or login); "
                          f"wait up to {FAILURE_WINDOW_S:g} s", {"Retry-After": "60"})

    def failed(self, client: str) -> None:
        """Count a failed token check of ``client``."""
        if len(self._failures) > 4096:  # a flood of addresses: forget the oldest
            self._failures.pop(next(iter(self._failures)))
        now = time.monotonic()
        self._failures.setdefault(client, deque(maxlen=self.per_client)).append(now)
        self._all_failures.append(now)

    def login(self, client: str, given: str) -> tuple[str, Session] | None:
        """A new session id and session when ``given`` is the token; a failure is counted."""
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            self._failures.pop(client, None)
            return self._new_session()
        self.failed(client)
        return None

    def _new_session(self) -> tuple[str, Session]:
        now = time.monotonic()
        for sid in [s for s, v in self._sessions.items() if v.expires < now]:
            del self._sessions[sid]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        sid = secrets.token_urlsafe(32)
        session = Session(secrets.token_urlsafe(24), now + SESSION_S)
        self._sessions[sid] = session
        return sid, session

    def logout(self, request: web.Request) -> None:
        self._sessions.pop(request.cookies.get(SESSION_COOKIE, ""), None)

    def set_cookies(self, response: web.StreamResponse, sid: str, session: Session) -> None:
        response.set_cookie(SESSION_COOKIE, sid, max_age=SESSION_S, path="/", httponly=True,
                            samesite="Strict", secure=self.secure)
        response.set_cookie(CSRF_COOKIE, session.csrf, max_age=SESSION_S, path="/",
                            samesite="Strict", secure=self.secure)

    def clear_cookies(self, response: web.StreamResponse) -> None:
        for name in (SESSION_COOKIE, CSRF_COOKIE):
            response.del_cookie(name, path="/")

    # -- the middleware -------------------------------------------------------------------------
    def refusal(self, request: web.Request) -> web.StreamResponse | None:
        """The response refusing ``request``, or ``None`` when it may go on."""
        if not self.host_allowed(request.headers.get("Host")):
            return error(421, f"this server does not answer to host {request.host!r} "
                              "(add it to http.allowed_hosts)")
        posting = request.method not in ("GET", "HEAD", "OPTIONS")
        if (posting or _is_api(request.path)) and self.cross_site(request):
            return error(403, "cross-site request refused")
        if self.token is None or _public(request):
            return None
        session = self.session(request)
        if self._has_bearer(request) and session is None:
            client = request.remote or "?"
            refused = self.throttle_refusal(client)
            if refused is not None:
                return refused
            if self.bearer_ok(request):
                return None
            self.failed(client)
            return error(401, "wrong bearer token", {"WWW-Authenticate": "Bearer"})
        if self.bearer_ok(request):
            return None
        if session is None:
            if _is_api(request.path):
                return error(401, "authentication required: Authorization: Bearer <token> "
                                  "or log in at /login", {"WWW-Authenticate": "Bearer"})
            raise web.HTTPSeeOther("/login")
        if posting:
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), session.csrf.encode()):
                return error(403, f"missing or wrong {CSRF_HEADER} header (the "
                                  f"{CSRF_COOKIE} cookie's value)")
        return None


def _public(request: web.Request) -> bool:
    path = request.path
    if path == "/openapi.json":
        return request.method in ("GET", "HEAD")
    return path == _PUBLIC[0] or path.startswith(_PUBLIC[1])


def _is_api(path: str) -> bool:
    return path.startswith("/v1/") or path == "/v1" or path.endswith(".json")


def error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """The JSON error response ``{"error": message}``."""
    return web.json_response({"error": message}, status=status, headers=headers)
