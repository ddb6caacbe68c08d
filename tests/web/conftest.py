"""A real pipeline (BlazeFace on the scene video made from real photographs, with a zone, a
line and recorded events) behind a real `WebServer` on a free loopback port."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from webclient import Client, Host, ServerFactory
from webscene import scene_pipeline
from webscene import wait_for as poll_until

from edgeinfer import Pipeline
from edgeinfer._net import free_port
from edgeinfer.config.http import HttpConfig
from edgeinfer.testing.scene_video import SceneTruth, astronaut_face_box, make_scene_video
from edgeinfer.web import WebServer

PIPELINE = "scene"
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
