"""Routes of the scene analytics events the pipelines keep for the web view (the last
``RECENT_EVENTS`` per pipeline): the list, one event, its snapshot and its clip.

A clip or snapshot is served only if the event names it AND its resolved path lies inside the
pipeline's media folder: nothing else on the disk can be reached through an event.
"""

from __future__ import annotations

import asyncio
import os
import stat
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..host import Host
from .base import Refused, dumps

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["CLIP_TYPES", "EventRoutes", "event_time"]

CLIP_TYPES = {".webm": "video/webm", ".mp4": "video/mp4", ".avi": "video/x-msvideo",
              ".mkv": "video/x-matroska"}
MAX_LIMIT = 200


class EventRoutes:
    """``/v1/events`` and below.

    Args:
        host: The daemon (`Host`: its pipelines).
        pool: Where file checks run.
    """

    def __init__(self, host: Host, pool: Executor) -> None:
        self.host, self.pool = host, pool

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/events", self.list)
        router.add_get("/v1/events/{id}", self.one)
        router.add_get("/v1/events/{id}/snapshot.jpg", self.snapshot)
        router.add_get("/v1/events/{id}/clip", self.clip)

    async def list(self, request: web.Request) -> web.Response:
        q = request.query
        limit = _limit(q.get("limit", "50"))
        name, kind = q.get("pipeline"), q.get("type")
        pipelines = self.host.pipelines
        if name is not None and not any(p.name == name for p in pipelines):
            raise Refused(404, f"no pipeline {name!r}; there are: "
                               f"{', '.join(p.name for p in pipelines) or 'none'}")
        found: list[tuple[Pipeline, dict[str, Any]]] = []
        for p in pipelines:
            if p.analytics is None or name not in (None, p.name):
                continue
            found.extend((p, e) for e in _recent(p) if kind in (None, e.get("type")))
        found.sort(key=lambda pe: event_time(pe[1]), reverse=True)  # stable: newest of a pipeline
        chosen = found[:limit]
        data = await asyncio.get_running_loop().run_in_executor(
            self.pool, lambda: [_with_urls(p, e) for p, e in chosen])
        return web.json_response(data, dumps=dumps)

    async def one(self, request: web.Request) -> web.Response:
        p, event = self.find(request.match_info["id"])
        data = await asyncio.get_running_loop().run_in_executor(self.pool, _with_urls, p, event)
        return web.json_response(data, dumps=dumps)

    async def snapshot(self, request: web.Request) -> web.StreamResponse:
        p, event = self.find(request.match_info["id"])
        path = _media_file(p, event, "snapshot")
        return web.FileResponse(path, headers={"Content-Type": "image/jpeg"})

    async def clip(self, request: web.Request) -> web.StreamResponse:
        p, event = self.find(request.match_info["id"])
        path = _media_file(p, event, "clip")
        ctype = CLIP_TYPES.get(path.suffix.lower(), "application/octet-stream")
        return web.FileResponse(path, headers={"Content-Type": ctype})

    def find(self, event_id: str) -> tuple[Pipeline, dict[str, Any]]:
        """The pipeline and event dict of ``event_id``.

        Raises:
            Refused: 404, no such event among those kept.
        """
        for p in self.host.pipelines:
            if p.analytics is None:
                continue
            for event in _recent(p):
                if event.get("event_id") == event_id:
                    return p, event
        raise Refused(404, f"no event {event_id!r} (unknown, or older than the last "
                           f"{MAX_LIMIT} of its pipeline)")


def _recent(p: Pipeline) -> list[dict[str, Any]]:
    assert p.analytics is not None
    for _ in range(3):
        try:
            return list(p.analytics.recent)[::-1]
        except RuntimeError:  # appended to while copied; try again
            continue
    return []


def event_time(event: dict[str, Any]) -> float:
    """When an event happened (its end, else its start, else ``t``; 0 when it names none)."""
    for key in ("end", "start", "t"):
        value = event.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def media_root(p: Pipeline) -> Path | None:
    """The pipeline's media folder, resolved (``None``: it records nothing)."""
    recorder = p.analytics.recorder if p.analytics is not None else None
    if recorder is None:
        return None
    return recorder.directory.resolve()  # = media_dir(state_dir, name)


def _checked(p: Pipeline, named: Any) -> Path | None:
    """``named`` resolved, if it is a file the recorder wrote inside the pipeline's media
    folder: a regular file (not a symlink) with one link (a hard link placed there to a file
    elsewhere has two or more), owned by this process's user."""
    root = media_root(p)
    if not isinstance(named, str) or not named or root is None:
        return None
    path = Path(named).resolve()
    if not path.is_relative_to(root):
        return None
    try:
        info = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.getuid():
        return None
    return path


def _media_file(p: Pipeline, event: dict[str, Any], kind: str) -> Path:
    named = event.get(kind)
    if named is None:
        why, pending = event.get(f"{kind}_missing"), event.get(f"{kind}_pending")
        if why:
            raise Refused(404, f"event {event['event_id']!r} has no {kind}: {why}")
        if pending:
            raise Refused(404, f"the {kind} of event {event['event_id']!r} is not written yet")
        raise Refused(404, f"event {event['event_id']!r} has no {kind} (not recorded for "
                           "its type)")
    path = _checked(p, named)
    if path is None:
        raise Refused(404, f"the {kind} of event {event['event_id']!r} is not there (not "
                           "written yet, or deleted by retention)")
    return path


def _with_urls(p: Pipeline, event: dict[str, Any]) -> dict[str, Any]:
    base = f"/v1/events/{event.get('event_id')}"
    snap = _checked(p, event.get("snapshot")) is not None
    clip = _checked(p, event.get("clip")) is not None
    return {**event, "snapshot_url": f"{base}/snapshot.jpg" if snap else None,
            "clip_url": f"{base}/clip" if clip else None}


def _limit(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise Refused(400, f"limit: expected an integer 1..{MAX_LIMIT}, got {raw!r}") from None
    if not 1 <= value <= MAX_LIMIT:
        raise Refused(400, f"limit: {value} is outside 1..{MAX_LIMIT}")
    return value
