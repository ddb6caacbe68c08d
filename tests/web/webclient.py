"""What the web tests share besides fixtures: the test host, the HTTP client, the token.

A module of its own (not ``conftest``): ``from conftest import ...`` in a test file finds
whichever conftest was imported first under that name (tests/conftest.py in a mixed worker).
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from edgeinfer import Pipeline
from edgeinfer.control.commands import CommandError
from edgeinfer.control.handlers import CommandHandlers
from edgeinfer.web import WebServer

TOKEN = "s3cret-token-for-tests-0123"


class Host:
    """The daemon's side of `edgeinfer.host.Host` the web server uses, on `CommandHandlers`."""

    def __init__(self, pipelines: list[Pipeline]) -> None:
        self._pipelines = pipelines
        self.handlers = CommandHandlers(self, status=self.status).table()

    @property
    def pipelines(self) -> list[Pipeline]:
        return self._pipelines

    @property
    def device_id(self) -> str:
        return "web-test"

    def status(self) -> dict[str, Any]:
        return {"device_id": self.device_id,
                "pipelines": {p.name: p.snapshot() for p in self._pipelines}}

    def reload(self) -> dict[str, Any]:
        raise CommandError("reload is not possible in this test host")

    def command(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        if verb not in self.handlers:
            raise CommandError(f"unknown command {verb!r}")
        return self.handlers[verb](dict(request))


ServerFactory = Callable[..., WebServer]


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """Plain ``http.client`` requests to one server: no redirect followed, any ``Host``."""

    def __init__(self, server: WebServer, context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(server.url)
        assert parts.hostname is not None and parts.port is not None
        self.host, self.port, self.tls = parts.hostname, parts.port, parts.scheme == "https"
        self.context = context

    def connect(self, timeout: float = 20.0) -> http.client.HTTPConnection:
        if self.tls:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def call(self, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> Reply:
        conn = self.connect()
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return Reply(response.status, response.headers, response.read())
        finally:
            conn.close()

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return self.call("GET", path, headers=headers)

    def post_json(self, path: str, data: Any, headers: dict[str, str] | None = None) -> Reply:
        return self.call("POST", path, json.dumps(data).encode(),
                         {"Content-Type": "application/json", **(headers or {})})
