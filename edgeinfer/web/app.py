"""The routes of the web server (``docs/web.md``; `edgeinfer.web.openapi` describes each).

Handlers never block the event loop: JPEG encoding, image decoding, model runs, the status
snapshot and commands go to a small thread pool. Every error is JSON ``{"error": ...}`` with a
4xx status for bad input; a 5xx means a bug and is logged.
"""

from __future__ import annotations

import asyncio
import html
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from aiohttp import web

from ..config.commands import VERBS
from ..control.commands import CommandError, decode_request
from ..errors import EdgeInferError
from .auth import Auth, error
from ..host import Host
from .base import Refused, dumps
from .events import EventRoutes
from .guard import BodyTimeout, ConnectionGuard, GuardedHandler, within
from .infer import MAX_AT_ONCE, ImageRefused, InferRequests, image_pipeline_problem
from .live import LiveFeeds
from .openapi import openapi_document

if TYPE_CHECKING:
    from ..config.http import HttpConfig
    from ..pipeline import Pipeline

__all__ = ["STATIC_DIR", "WebApp", "not_found"]

logger = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).resolve().parent / "static"
PAGES = {"/": "index.html", "/events": "events.html", "/live/{name}": "live.html"}
MAX_COMMAND_BYTES = 65536
MAX_LOGIN_BYTES = 4096  # the login form is public: its body is read only this far
LATENCY_BINS_MS = [0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
                   5000.0]
"""Lower edges of the latency histogram's bins; the last bin is open-ended."""
_LOGIN_FORM = b"""<!doctype html><html><head><meta charset="utf-8"><title>edgeinfer login</title>
</head><body><form method="post" action="/login"><label>Token <input type="password"
name="token" autofocus></label> <button>Log in</button></form></body></html>"""
_NOT_FOUND = """<!doctype html><html><head><meta charset="utf-8"><title>edgeinfer: not found</title>
</head><body><h1>Not found</h1><p>{what}</p><p><a href="/">The device page</a></p></body></html>"""
_PAGE_CSP = ("default-src 'self'; img-src 'self' data: blob:; media-src 'self'; "
             "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")


class WebApp:
    """The aiohttp application of one `WebServer` and its counters.

    Args:
        config: The ``http:`` section.
        host: The daemon (`Host`).
        pool: Where blocking work runs.
        guard: The server's connection limits (`ConnectionGuard`; one of its own if none).
    """

    def __init__(self, config: HttpConfig, host: Host, pool: ThreadPoolExecutor,
                 guard: ConnectionGuard | None = None) -> None:
        self.config, self.host, self.pool = config, host, pool
        self.guard = guard or ConnectionGuard.from_config(config, config.max_connections or 1024)
        self.auth = Auth(config)
        self.feeds = LiveFeeds(config.live_fps, config.live_quality, config.max_viewers, pool,
                               config.live_stall_s)
        self.infer = InferRequests(int(config.max_upload_mb * 1024 * 1024), config.max_pixels,
                                   config.body_timeout_s)
        self.events = EventRoutes(host, pool)
        self.requests = 0
        self.by_class: dict[str, int] = {}
        self.dropped = {"body_timeouts": 0, "client_gone": 0}

    def stats(self) -> dict[str, Any]:
        """Requests, answers by status class, live viewers and frames, inference calls, the
        connections and what was refused, closed or throttled."""
        return {"requests": self.requests, "responses": dict(self.by_class),
                **self.feeds.stats(), "infer_calls": self.infer.calls,
                "infer_refused_busy": self.infer.refused_busy,
                "connections": self.guard.stats(), **self.dropped,
                "auth_throttled": self.auth.throttled_count}

    def build(self) -> web.Application:
        app = web.Application(middlewares=[self._count, self._secure, self._errors],
                              client_max_size=self.infer.max_bytes + 64 * 1024)
        app.on_response_prepare.append(_headers)
        app.on_shutdown.append(lambda _app: self.feeds.close())
        r = app.router
        r.add_get("/v1/status", self.status)
        r.add_get("/v1/session", self.session)
        r.add_get("/v1/pipelines", self.pipelines)
        r.add_get("/v1/pipelines/{name}/snapshot.jpg", self.snapshot)
        r.add_get("/v1/pipelines/{name}/live.mjpg", self.live)
        r.add_get("/v1/pipelines/{name}/latency", self.latency)
        self.events.add_to(r)
        r.add_post("/v1/infer", self.run_infer)
        r.add_post("/v1/commands/{verb}", self.command)
        r.add_get("/openapi.json", self.openapi)
        r.add_get("/login", self.login_page)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/static/{path:.+}", self.static)
        for route, page in PAGES.items():
            r.add_get(route, self._page(page))
        return app

    # -- middlewares ----------------------------------------------------------------------------
    @web.middleware
    async def _count(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests += 1
        status = 500
        connection = request.protocol
        if isinstance(connection, GuardedHandler):
            connection.request_started()
        try:
            response: web.StreamResponse = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            key = f"{status // 100}xx"
            self.by_class[key] = self.by_class.get(key, 0) + 1
            if isinstance(connection, GuardedHandler):
                connection.request_done()

    @web.middleware
    async def _secure(self, request: web.Request, handler: Any) -> web.StreamResponse:
        refused = self.auth.refusal(request)
        if refused is not None:
            return refused
        response: web.StreamResponse = await handler(request)
        return response

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except Refused as exc:
            return error(exc.status, str(exc))
        except BodyTimeout as exc:
            self.dropped["body_timeouts"] += 1
            response = error(408, str(exc))
            response.force_close()
            return response
        except (ConnectionError, web.RequestPayloadError) as exc:  # the client went away
            self.dropped["client_gone"] += 1
            self.guard.log.exception("%s %s: the client went away", request.method,
                                     request.path, exc_info=exc)
            response = error(400, "the client went away before its request was read")
            response.force_close()
            return response
        except web.HTTPException as exc:
            if exc.status == 404 and not _is_api(request):
                return not_found(f"There is no page {request.path}.")
            if exc.status < 400 or not _is_api(request):
                raise
            keep = {k: v for k, v in exc.headers.items()
                    if k.lower() not in ("content-type", "content-length")}
            return error(exc.status, _reason(exc, request), keep)
        except Exception:
            logger.exception("web: %s %s failed", request.method, request.path)
            return error(500, "internal error (logged)")

    # -- API ------------------------------------------------------------------------------------
    async def status(self, request: web.Request) -> web.Response:
        data = await self._blocking(self.host.status)
        return web.json_response({**data, "http": self.stats()}, dumps=dumps)

    async def session(self, request: web.Request) -> web.Response:
        found = self.auth.session(request)
        how = ("none" if self.auth.token is None else
               "bearer" if self.auth.bearer_ok(request) else "cookie")
        return web.json_response({"auth": how, "csrf": found.csrf if found else None,
                                  "csrf_header": "X-Edgeinfer-CSRF",
                                  "device_id": self.host.device_id})

    async def pipelines(self, request: web.Request) -> web.Response:
        data = await self._blocking(lambda: [_describe(p) for p in self.host.pipelines])
        return web.json_response(data, dumps=dumps)

    async def snapshot(self, request: web.Request) -> web.Response:
        pipeline = self.find(request.match_info["name"])
        quality = _int_param(request, "quality", 85, 1, 100)
        if pipeline.latest() is None:
            raise Refused(409, f"pipeline {pipeline.name!r} has processed no frame yet")
        try:
            jpeg = await self._blocking(pipeline.snapshot_jpeg, quality)
        except Exception as exc:  # StateError: an audio pipeline, or no image frame yet
            raise Refused(409, str(exc)) from None
        return web.Response(body=jpeg, content_type="image/jpeg")

    async def live(self, request: web.Request) -> web.StreamResponse:
        return await self.feeds.serve(request, self.find(request.match_info["name"]))

    async def latency(self, request: web.Request) -> web.Response:
        pipeline = self.find(request.match_info["name"])
        return web.json_response(await self._blocking(latency_histogram, pipeline))

    async def run_infer(self, request: web.Request) -> web.Response:
        name = request.query.get("pipeline")
        if not name:
            raise Refused(400, "give the pipeline: POST /v1/infer?pipeline=NAME")
        pipeline = self.find(name)
        problem = image_pipeline_problem(pipeline)
        if problem is not None:
            raise Refused(409, problem)
        # The slot is taken before the body is read: at most MAX_AT_ONCE uploads are in memory.
        if not self.infer.try_enter():
            response = error(429, f"{MAX_AT_ONCE} inference requests are running; try again",
                             {"Retry-After": "1"})
            response.force_close()  # the body is not read
            return response
        try:
            data = await self.infer.read_upload(request)
            if isinstance(data, web.Response):
                return data
            result = await self._blocking(self.infer.run, pipeline, data)
        except ImageRefused as exc:
            raise Refused(exc.status, str(exc)) from None
        finally:
            self.infer.leave()
        return web.json_response(result, dumps=dumps)

    async def command(self, request: web.Request) -> web.Response:
        verb = request.match_info["verb"]
        if verb not in VERBS:
            raise Refused(404, f"unknown command {verb!r}; valid: {', '.join(VERBS)}")
        if request.content_type != "application/json":
            raise Refused(415, "commands take Content-Type: application/json")
        if (request.content_length or 0) > MAX_COMMAND_BYTES:
            raise Refused(413, f"a command is at most {MAX_COMMAND_BYTES} bytes")
        body = await within(self.config.body_timeout_s,
                            request.content.read(MAX_COMMAND_BYTES + 1))
        try:
            if len(body) > MAX_COMMAND_BYTES:
                raise CommandError(f"a command is at most {MAX_COMMAND_BYTES} bytes")
            result = await self._blocking(self.host.command, verb, decode_request(body))
        except EdgeInferError as exc:  # as over MQTT: e.g. set's ConfigError is a refusal
            return web.json_response({"ok": False, "error": str(exc)}, status=400)
        return web.json_response({"ok": True, "result": result}, dumps=dumps)

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_document())

    # -- pages and login ------------------------------------------------------------------------
    def _page(self, name: str) -> Any:
        async def page(request: web.Request) -> web.StreamResponse:
            if "name" in request.match_info:
                try:
                    self.find(request.match_info["name"])
                except Refused as exc:
                    return not_found(str(exc))
            return _static_file(name)
        return page

    async def static(self, request: web.Request) -> web.StreamResponse:
        return _static_file(request.match_info["path"])

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        if self.auth.token is None:
            return not_found("This server has no token (http.token): there is nothing to "
                             "log in to.")
        if (STATIC_DIR / "login.html").is_file():
            return _static_file("login.html")
        return web.Response(body=_LOGIN_FORM, content_type="text/html")

    async def login(self, request: web.Request) -> web.StreamResponse:
        if self.auth.token is None:
            raise Refused(400, "this server has no token: no login needed")
        client = request.remote or "?"
        refused = self.auth.throttle_refusal(client)
        if refused is not None:
            return refused
        if request.content_type != "application/x-www-form-urlencoded":
            raise Refused(415, "log in with a form: Content-Type "
                               "application/x-www-form-urlencoded, field token")
        body = await within(self.config.body_timeout_s, _read_at_most(request, MAX_LOGIN_BYTES))
        if body is None:
            raise Refused(413, f"a login form is at most {MAX_LOGIN_BYTES} bytes")
        given = parse_qs(body.decode("utf-8", "replace")).get("token", [""])[0]
        found = self.auth.login(client, given)
        if found is None:
            return error(401, "wrong token")
        response = _see_other("/")
        self.auth.set_cookies(response, *found)
        return response

    async def logout(self, request: web.Request) -> web.StreamResponse:
        self.auth.logout(request)
        response = _see_other("/login")
        self.auth.clear_cookies(response)
        return response

    # -- helpers --------------------------------------------------------------------------------
    def find(self, name: str) -> Pipeline:
        """The running pipeline called ``name``.

        Raises:
            Refused: 404, naming the pipelines there are.
        """
        pipelines = self.host.pipelines
        for p in pipelines:
            if p.name == name:
                return p
        raise Refused(404, f"no pipeline {name!r}; there are: "
                           f"{', '.join(p.name for p in pipelines) or 'none'}")

    async def _blocking(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)


def _describe(p: Pipeline) -> dict[str, Any]:
    snap = p.snapshot()
    config = p.task.config
    task_type = getattr(getattr(config, "__struct_config__", None), "tag", None)
    geometry = p.analytics.geometry() if p.analytics is not None else []
    latest = p.latest()
    return {
        "name": p.name, "task": task_type or type(p.task).__name__, "state": snap["state"],
        "health": snap["health"], "fps": snap["fps"], "model": snap["model"], "provider": snap["provider"],
        "backend": snap["backend"], "paused": p.paused,
        "frame": ({"width": latest[0].width, "height": latest[0].height}
                  if latest is not None and latest[0].kind == "image" else None),
        "zones": [{"name": n, "points": pts.tolist()} for n, k, pts in geometry if k == "zone"],
        "lines": [{"name": n, "points": pts.tolist()} for n, k, pts in geometry if k == "line"],
        "stats": snap,
        "urls": {"live": f"/v1/pipelines/{p.name}/live.mjpg",
                 "snapshot": f"/v1/pipelines/{p.name}/snapshot.jpg",
                 "latency": f"/v1/pipelines/{p.name}/latency", "page": f"/live/{p.name}"},
    }


def latency_histogram(p: Pipeline) -> dict[str, Any]:
    """Counts of the pipeline's recent latencies (its stats windows) in ``LATENCY_BINS_MS``."""
    stats = p.stats
    windows = {"end_to_end": stats.latency, "infer": stats.infer, "pre": stats.pre,
               "post": stats.post, "wait": stats.wait}
    return {"pipeline": p.name, "bins_ms": LATENCY_BINS_MS,
            **{name: {"counts": w.histogram(LATENCY_BINS_MS), **w.summary()}
               for name, w in windows.items()}}


async def _read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The request body, or ``None`` when it is longer than ``limit`` (read no further)."""
    data = bytearray()
    while len(data) <= limit:
        chunk = await request.content.read(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data) if len(data) <= limit else None


def not_found(what: str) -> web.Response:
    """The HTML 404 page saying ``what`` was not found."""
    return web.Response(status=404, content_type="text/html",
                        text=_NOT_FOUND.format(what=html.escape(what)))


def _see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _static_file(relative: str) -> web.StreamResponse:
    root = STATIC_DIR
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise web.HTTPNotFound(text=f"no such file: {relative}")
    return web.FileResponse(path)


def _int_param(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise Refused(400, f"{name}: expected an integer {low}..{high}, got {raw!r}") from None
    if not low <= value <= high:
        raise Refused(400, f"{name}: {value} is outside {low}..{high}")
    return value


def _is_api(request: web.Request) -> bool:
    return request.path.startswith("/v1") or request.path.endswith(".json") or \
        request.method != "GET"


def _reason(exc: web.HTTPException, request: web.Request) -> str:
    if exc.status == 404:
        return f"no route {request.path}"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path}"
    if exc.status == 413:
        return f"request body too large: {exc.text or exc.reason}"
    return exc.text or exc.reason


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    h = response.headers
    h.setdefault("X-Content-Type-Options", "nosniff")
    h.setdefault("X-Frame-Options", "DENY")
    h.setdefault("Referrer-Policy", "no-referrer")
    if response.content_type == "text/html":
        h.setdefault("Content-Security-Policy", _PAGE_CSP)
    if request.path.startswith("/v1/") or request.path == "/openapi.json":
        h["Cache-Control"] = "no-store"
