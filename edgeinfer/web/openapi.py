"""The OpenAPI 3.1 document of the web server, written by hand: every route, its parameters,
request body, responses and errors. ``GET /openapi.json`` serves it."""

from __future__ import annotations

from typing import Any

from ..version import __version__
from ..health import STATES

__all__ = ["openapi_document"]

_JSON = "application/json"
_OBJ: dict[str, Any] = {"type": "object", "additionalProperties": True}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(description: str, schema: dict[str, Any], media: str = _JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref("Error")}}}


def _errors(**codes: str) -> dict[str, Any]:
    base = {"401": "authentication required (a token is configured), or a wrong bearer token",
            "403": "cross-site request (Origin or Sec-Fetch-Site)",
            "421": "the Host header names another server",
            "429": "too many failed token checks lately (from this address, or from all); "
                   "see Retry-After"}
    base.update({k.lstrip("e"): v for k, v in codes.items()})
    return {code: _err(text) for code, text in base.items()}


def _name(description: str = "A pipeline's name.") -> dict[str, Any]:
    return {"name": "name", "in": "path", "required": True, "description": description,
            "schema": {"type": "string"}}


def _event_id() -> dict[str, Any]:
    return {"name": "id", "in": "path", "required": True, "description": "The event's id.",
            "schema": {"type": "string"}}


def _get(summary: str, ok: dict[str, Any], params: list[dict[str, Any]] | None = None,
         **errors: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "parameters": params or [],
                    "responses": {"200": ok, **_errors(**errors)}}}


def _schemas() -> dict[str, Any]:
    number = {"type": "number"}
    point = {"type": "array", "items": number, "minItems": 2, "maxItems": 2}
    shape = {"type": "object", "required": ["name", "points"],
             "properties": {"name": {"type": "string"}, "points": {"type": "array",
                                                                   "items": point}}}
    model = {"type": "object", "properties": {"name": {"type": "string"},
                                              "version": {"type": ["string", "null"]},
                                              "sha256": {"type": "string"}}}
    window = {"type": "object", "properties": {
        "counts": {"type": "array", "items": {"type": "integer"}},
        "p50": number, "p99": number, "mean": number}}
    return {
        "Error": {"type": "object", "required": ["error"],
                  "properties": {"error": {"type": "string"}}},
        "Model": model,
        "Health": {"type": "object", "required": ["state", "reason", "retries", "next_retry_at"],
                   "description": "A pipeline's state; only running is healthy (edgeinfer.health).",
                   "properties": {
                       "state": {"enum": list(STATES)},
                       "reason": {"type": "string",
                                  "description": "Why it is not running, with the fix."},
                       "retries": {"type": "integer", "description": "Source reopen attempts."},
                       "next_retry_at": {"type": ["number", "null"],
                                         "description": "Unix time of the next attempt."}}},
        "Pipeline": {"type": "object", "required": ["name", "task", "state", "health", "urls"],
                     "properties": {
                         "name": {"type": "string"}, "task": {"type": "string"},
                         "state": {"enum": list(STATES)}, "health": _ref("Health"),
                         "fps": number, "model": model, "provider": {"type": "string"},
                         "backend": {"type": ["object", "null"]}, "paused": {"type": "boolean"},
                         "frame": {"type": ["object", "null"]},
                         "zones": {"type": "array", "items": shape},
                         "lines": {"type": "array", "items": shape},
                         "stats": _OBJ, "urls": {"type": "object",
                                                 "additionalProperties": {"type": "string"}}}},
        "Latency": {"type": "object", "required": ["pipeline", "bins_ms"], "properties": {
            "pipeline": {"type": "string"},
            "bins_ms": {"type": "array", "items": number,
                        "description": "lower edges of the bins; the last is open-ended"},
            **{k: window for k in ("end_to_end", "infer", "pre", "post", "wait")}}},
        "Event": {"type": "object", "required": ["event_id", "pipeline", "type"],
                  "additionalProperties": True, "properties": {
                      "event_id": {"type": "string"}, "pipeline": {"type": "string"},
                      "type": {"type": "string"},
                      "snapshot_url": {"type": ["string", "null"]},
                      "clip_url": {"type": ["string", "null"]},
                      "clip_format": {"type": ["string", "null"]},
                      "clip_remux": {"type": ["boolean", "null"]}}},
        "InferResult": {"type": "object", "additionalProperties": True,
                        "required": ["pipeline", "model", "provider", "latency_ms", "image"],
                        "properties": {
                            "pipeline": {"type": "string"}, "model": model,
                            "provider": {"type": "string"},
                            "latency_ms": {"type": "object", "properties": {
                                "pre": number, "infer": number, "post": number}},
                            "image": {"type": "object", "properties": {
                                "width": {"type": "integer"}, "height": {"type": "integer"}}},
                            "detections": {"type": "array", "items": _OBJ},
                            "top": {"type": "array", "items": _OBJ},
                            "outputs": _OBJ}},
        "CommandReply": {"type": "object", "required": ["ok"], "properties": {
            "ok": {"type": "boolean"}, "result": _OBJ, "error": {"type": "string"}}},
        "Session": {"type": "object", "properties": {
            "auth": {"enum": ["none", "bearer", "cookie"]},
            "csrf": {"type": ["string", "null"]}, "csrf_header": {"type": "string"},
            "device_id": {"type": "string"}}},
    }


def _paths() -> dict[str, Any]:
    jpeg = {"type": "string", "format": "binary"}
    quality = {"name": "quality", "in": "query", "required": False,
               "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 85}}
    events_params = [
        {"name": "pipeline", "in": "query", "required": False, "schema": {"type": "string"}},
        {"name": "type", "in": "query", "required": False, "schema": {"type": "string"},
         "description": "enter, exit, cross, loiter, ..."},
        {"name": "limit", "in": "query", "required": False,
         "schema": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}}]
    video = {m: {"schema": jpeg} for m in ("video/webm", "video/mp4", "video/x-msvideo")}
    page = {"description": "the page", "content": {"text/html": {"schema": {"type": "string"}}}}
    return {
        "/v1/status": _get("The device: what the status command answers, plus http stats.",
                           _ok("status", _OBJ)),
        "/v1/session": _get("How this request is authenticated; the CSRF token of a cookie "
                            "session.", _ok("session", _ref("Session"))),
        "/v1/pipelines": _get("The pipelines.", _ok("pipelines", {"type": "array",
                                                                  "items": _ref("Pipeline")})),
        "/v1/pipelines/{name}/snapshot.jpg": _get(
            "The latest frame, annotated, as JPEG.", _ok("JPEG", jpeg, "image/jpeg"),
            [_name(), quality], e400="bad quality", e404="no such pipeline",
            e409="no image frame processed yet"),
        "/v1/pipelines/{name}/live.mjpg": _get(
            "Live view: multipart/x-mixed-replace JPEG frames at most http.live_fps.",
            _ok("MJPEG stream", jpeg, "multipart/x-mixed-replace"), [_name()],
            e404="no such pipeline", e503="http.max_viewers live views are open"),
        "/v1/pipelines/{name}/latency": _get(
            "Histogram of recent latencies (ms).", _ok("histogram", _ref("Latency")), [_name()],
            e404="no such pipeline"),
        "/v1/events": _get("Recent scene events, newest first.",
                           _ok("events", {"type": "array", "items": _ref("Event")}),
                           events_params, e400="bad limit", e404="no such pipeline"),
        "/v1/events/{id}": _get("One event.", _ok("event", _ref("Event")), [_event_id()],
                                e404="no such event"),
        "/v1/events/{id}/snapshot.jpg": _get(
            "The event's snapshot.", _ok("JPEG", jpeg, "image/jpeg"), [_event_id()],
            e404="no such event, or no snapshot (yet)"),
        "/v1/events/{id}/clip": {"get": {
            "summary": "The event's clip (HTTP Range supported).",
            "parameters": [_event_id(), {"name": "Range", "in": "header", "required": False,
                                         "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the clip", "content": video},
                          "206": {"description": "a range of the clip", "content": video},
                          "416": {"description": "range not satisfiable"},
                          **_errors(e404="no such event, or no clip (yet)")}}},
        "/v1/infer": {"post": {
            "summary": "Run one image through a pipeline's task and model.",
            "parameters": [{"name": "pipeline", "in": "query", "required": True,
                            "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {
                "image/jpeg": {"schema": jpeg}, "image/png": {"schema": jpeg},
                "application/octet-stream": {"schema": jpeg},
                "multipart/form-data": {"schema": {"type": "object", "properties": {
                    "file": jpeg}, "required": ["file"]}}}},
            "responses": {"200": _ok("the task's result", _ref("InferResult")), **_errors(
                e400="no pipeline given, broken image, no file field",
                e403="cross-site request, or a cookie session without the CSRF header",
                e404="no such pipeline", e409="the pipeline does not take images",
                e413="over http.max_upload_mb or http.max_pixels",
                e415="not an image, or another Content-Type",
                e408="the body did not arrive within http.body_timeout_s",
                e429="2 requests are running, or too many failed token checks",
                e503="the model cannot take web requests")}}},
        "/v1/commands/{verb}": {"post": {
            "summary": "A command verb, as over MQTT (same handlers and allow-list).",
            "parameters": [{"name": "verb", "in": "path", "required": True, "schema": {
                "enum": ["status", "pause", "resume", "reload", "snapshot", "set", "reset"]}}],
            "requestBody": {"required": True, "content": {_JSON: {"schema": _OBJ}}},
            "responses": {"200": _ok("done", _ref("CommandReply")),
                          "400": _ok("refused (CommandError)", _ref("CommandReply")),
                          **_errors(e403="cross-site request, or missing CSRF header",
                                    e404="unknown verb", e408="body too slow", e413="over 64 KiB",
                                    e415="Content-Type is not application/json")}}},
        "/openapi.json": {"get": {"summary": "This document.", "security": [],
                                  "responses": {"200": _ok("OpenAPI", _OBJ)}}},
        "/login": {"get": {"summary": "The login form.", "security": [],
                           "responses": {"200": page, "404": {
                               "description": "no token is configured: nothing to log in to",
                               "content": {"text/html": {"schema": {"type": "string"}}}}}},
                   "post": {"summary": "Log in with the token; sets the session and CSRF "
                                       "cookies.", "security": [],
                            "requestBody": {"required": True, "content": {
                                "application/x-www-form-urlencoded": {"schema": {
                                    "type": "object", "required": ["token"],
                                    "properties": {"token": {"type": "string"}}}}}},
                            "responses": {"303": {"description": "logged in: to /"},
                                          **_errors(e400="no token is configured",
                                                    e403="cross-site request",
                                                    e408="body too slow",
                                                    e413="a form over 4 KiB",
                                                    e415="not a urlencoded form",
                                                    e429="too many failed logins")}}},
        "/logout": {"post": {"summary": "End the cookie session.",
                             "responses": {"303": {"description": "to /login"},
                                           **_errors(e403="missing CSRF header")}}},
        "/": {"get": {"summary": "The device page.", "responses": {"200": page}}},
        "/events": {"get": {"summary": "The events page.", "responses": {"200": page}}},
        "/live/{name}": {"get": {"summary": "A pipeline's live page.", "parameters": [_name()],
                                 "responses": {"200": page, **_errors(), "404": {
                                     "description": "no such pipeline (an HTML page)",
                                     "content": {"text/html": {"schema": {
                                         "type": "string"}}}}}}},
        "/static/{path}": {"get": {
            "summary": "The pages' assets.", "security": [],
            "parameters": [{"name": "path", "in": "path", "required": True,
                            "schema": {"type": "string"}}],
            "responses": {"200": {"description": "the file"}, "404": {
                "description": "no such file (an HTML page)",
                "content": {"text/html": {"schema": {"type": "string"}}}}}}},
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh dict)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "edgeinfer device API", "version": __version__,
                 "description": "The local web view and REST API of an edgeinfer daemon "
                                "(docs/web.md)."},
        "paths": _paths(),
        "components": {"schemas": _schemas(), "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer",
                       "description": "http.token; absent on a loopback bind without one"},
            "cookie": {"type": "apiKey", "in": "cookie", "name": "edgeinfer_session",
                       "description": "set by POST /login; POSTs add X-Edgeinfer-CSRF"}}},
        "security": [{"bearer": []}, {"cookie": []}, {}],
    }
