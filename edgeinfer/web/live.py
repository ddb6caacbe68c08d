"""Live MJPEG views: one shared encoder per pipeline, running only while someone watches.

The encoder wakes at most ``live_fps`` times a second, encodes the pipeline's latest frame
(with its boxes, track ids, zones and lines drawn) only if it has not encoded that frame yet,
and hands the JPEG to every viewer. A viewer sends the newest JPEG when its connection can take
it; one that is slower simply skips frames (nothing queues up per viewer), and one whose
connection takes no frame for ``http.live_stall_s`` (a client that never reads) is dropped, so
its slot frees. With no viewer there is no encoder, so the pipeline's cost of the web view is
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..pipeline.tuning import annotate
from .auth import error

if TYPE_CHECKING:
    from ..frames import Frame, TaskResult
    from ..pipeline import Pipeline

__all__ = ["BOUNDARY", "LiveFeed", "LiveFeeds"]

BOUNDARY = "edgeinferframe"
_POLL_S = 1.0  # how often a waiting viewer looks whether its client left
_SEND_BUFFER = 256 * 1024  # bytes the kernel holds for one viewer


class LiveFeed:
    """The shared encoder of one pipeline and its latest JPEG.

    Args:
        pipeline: The pipeline watched.
        fps: Most frames per second encoded (and so sent to any viewer).
        quality: JPEG quality.
        pool: Where encoding runs (never on the event loop).
    """

    def __init__(self, pipeline: Pipeline, fps: float, quality: int, pool: Executor) -> None:
        self.pipeline = pipeline
        self.period = 1.0 / fps
        self.quality = quality
        self.pool = pool
        self.viewers = 0
        self.encoded = 0  # frames encoded so far (it stays put while nobody watches)
        self.jpeg: bytes | None = None
        self.seq = 0
        self.closing = False
        self._cond = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def join(self) -> None:
        """A viewer arrives; the encoder starts if it is not running."""
        self.viewers += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._encode_loop())

    def leave(self) -> None:
        self.viewers -= 1

    async def next_frame(self, seen: int, alive: Callable[[], bool] = lambda: True
                         ) -> tuple[bytes, int] | None:
        """The newest JPEG after ``seen`` and its number; ``None`` when the feed closes or
        ``alive()`` (the viewer's connection) says the viewer left."""
        async with self._cond:
            while self.seq <= seen or self.jpeg is None:
                if self.closing or not alive():
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._cond.wait(), _POLL_S)
            return self.jpeg, self.seq

    async def close(self) -> None:
        self.closing = True
        async with self._cond:
            self._cond.notify_all()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _encode_loop(self) -> None:
        loop = asyncio.get_running_loop()
        last: Frame | None = None
        due = loop.time()
        while self.viewers > 0 and not self.closing:
            latest = self.pipeline.latest()
            if latest is not None and latest[0] is not last and latest[0].kind == "image":
                last = latest[0]
                jpeg = await loop.run_in_executor(self.pool, self._encode, latest)
                self.encoded += 1
                async with self._cond:
                    self.jpeg, self.seq = jpeg, self.seq + 1
                    self._cond.notify_all()
            due = max(due + self.period, loop.time())
            await asyncio.sleep(due - loop.time())

    def _encode(self, latest: tuple[Frame, TaskResult]) -> bytes:
        analytics = self.pipeline.analytics
        geometry = analytics.geometry() if analytics is not None else ()
        return annotate(latest[0], latest[1], self.quality, geometry)


class LiveFeeds:
    """The live feeds of every pipeline, created on first use, and the viewer limit.

    Args:
        fps: ``http.live_fps``.
        quality: ``http.live_quality``.
        max_viewers: ``http.max_viewers``, over all pipelines.
        pool: Where encoding runs.
    """

    def __init__(self, fps: float, quality: int, max_viewers: int, pool: Executor,
                 stall_s: float = 10.0) -> None:
        self.fps, self.quality, self.max_viewers, self.pool = fps, quality, max_viewers, pool
        self.stall_s = stall_s
        self.stalled = 0  # viewers dropped because their connection did not drain
        self._feeds: dict[int, LiveFeed] = {}

    def feed(self, pipeline: Pipeline) -> LiveFeed:
        found = self._feeds.get(id(pipeline))
        if found is None or found.pipeline is not pipeline:
            found = LiveFeed(pipeline, self.fps, self.quality, self.pool)
            self._feeds[id(pipeline)] = found
        return found

    @property
    def viewers(self) -> int:
        return sum(f.viewers for f in self._feeds.values())

    @property
    def encoded(self) -> int:
        return sum(f.encoded for f in self._feeds.values())

    def stats(self) -> dict[str, Any]:
        return {"viewers": self.viewers, "frames_encoded": self.encoded,
                "viewers_dropped_stalled": self.stalled,
                "by_pipeline": {f.pipeline.name: {"viewers": f.viewers, "encoded": f.encoded}
                                for f in self._feeds.values()}}

    async def close(self) -> None:
        for feed in list(self._feeds.values()):
            await feed.close()

    async def serve(self, request: web.Request, pipeline: Pipeline) -> web.StreamResponse:
        """Stream ``pipeline``'s live view to one viewer until it or the server goes."""
        if self.viewers >= self.max_viewers:
            return error(503, f"{self.max_viewers} live views are open already "
                              "(http.max_viewers)", {"Retry-After": "5"})
        feed = self.feed(pipeline)
        feed.join()
        try:
            return await self._stream(request, feed)
        finally:
            feed.leave()

    async def _stream(self, request: web.Request, feed: LiveFeed) -> web.StreamResponse:
        response, stalled = await _stream(request, feed, self.stall_s)
        if stalled:  # the viewer's socket did not drain: drop it
            self.stalled += 1
            if request.transport is not None:
                request.transport.abort()
        return response


async def _stream(request: web.Request, feed: LiveFeed, stall_s: float
                  ) -> tuple[web.StreamResponse, bool]:
    response = web.StreamResponse(headers={
        "Content-Type": f"multipart/x-mixed-replace; boundary={BOUNDARY}",
        "Cache-Control": "no-store", "Pragma": "no-cache"})
    await response.prepare(request)
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None:  # a few frames in the kernel at most: a stalled viewer shows soon
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)

    def alive() -> bool:
        return transport is not None and not transport.is_closing()

    seen = 0
    while True:
        got = await feed.next_frame(seen, alive)
        if got is None:
            break
        jpeg, seen = got
        head = (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                f"Content-Length: {len(jpeg)}\r\n\r\n").encode()
        try:
            async with asyncio.timeout(stall_s):
                await response.write(head + jpeg + b"\r\n")
        except ConnectionError:  # the viewer left
            break
        except TimeoutError:
            return response, True
    return response, False
