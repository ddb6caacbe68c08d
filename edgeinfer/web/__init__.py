"""The daemon's local web view and REST API (``http:`` in the config, ``docs/web.md``).

`WebServer` serves the pages in ``static/``, live MJPEG views of the pipelines, their events
with snapshots and clips, ``POST /v1/infer`` on a pipeline's model and the command verbs, with
an OpenAPI document at ``/openapi.json``. It runs aiohttp on a thread of its own.
"""

from __future__ import annotations

from .server import WebServer

__all__ = ["WebServer"]
