"""A real pipeline (BlazeFace on the scene video made from real photographs, with a zone, a
line and recorded events) behind a real `WebServer` on a free loopback port."""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest
from webscene import scene_pipeline
from webscene import wait_for as poll_until

from edgeinfer import Pipeline
from edgeinfer._net import free_port
from edgeinfer.config.http import HttpConfig
from edgeinfer.control.commands import CommandError
from edgeinfer.control.handlers import CommandHandlers
from edgeinfer.testing.scene_video import SceneTruth, astronaut_face_box, make_scene_video
from edgeinfer.web import WebServer

PIPELINE = "scene"
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


@pytest.fixture(scope="session")
def truth(blazeface_path: Path, tmp_path_factory: pytest.TempPathFactory) -> SceneTruth:
    folder = tmp_path_factory.mktemp("webscene")
    return make_scene_video(folder / "scene.avi", astronaut_face_box(blazeface_path))


@pytest.fixture(scope="session")
def pipeline(truth: SceneTruth, blazeface_path: Path,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    folder = tmp_path_factory.mktemp("webstate")
    config = {
        "device_id": "web-test",
        "runtime": {"state_dir": str(folder / "state")},
        "pipelines": [scene_pipeline(PIPELINE, truth, blazeface_path, folder)],
    }
    path = folder / "web.json"
    path.write_text(json.dumps(config))
    p = Pipeline.from_config(str(path))
    p.start()
    deadline = time.monotonic() + 20
    while p.latest() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert p.latest() is not None, "the pipeline made no result"
    yield p
    p.close()


@pytest.fixture(scope="session")
def host(pipeline: Pipeline) -> Host:
    return Host([pipeline])


ServerFactory = Callable[..., WebServer]


@pytest.fixture
def make_server(host: Host) -> Iterator[ServerFactory]:
    """Start a `WebServer` with ``http:`` options given as keywords (``port`` free)."""
    started: list[WebServer] = []

    def make(**options: Any) -> WebServer:
        options.setdefault("port", free_port())
        config = msgspec.convert(options, HttpConfig)
        server = WebServer(config, host)
        server.start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def server(make_server: ServerFactory) -> WebServer:
    return make_server(live_fps=5.0)




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


@pytest.fixture
def client(server: WebServer) -> Client:
    return Client(server)


@pytest.fixture
def client_of() -> type[Client]:
    """The `Client` class, for servers a test starts itself."""
    return Client


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """``wait_for(check, timeout, what)``: poll ``check`` until truthy; its value."""
    return poll_until
