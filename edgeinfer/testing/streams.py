"""Real stream servers on loopback, for tests and smoke checks of the ``camera`` source.

    with MjpegServer(width=320, height=240, fps=25) as server:
        cap = cv2.VideoCapture(server.url)

    with RtspServer() as server:           # GStreamer's RTSP server, in a subprocess
        cap = cv2.VideoCapture(server.url)

    with RtspServer(codec="h264", substream=(160, 120)) as server:   # H.264, and a substream
        server.url, server.sub_url

    with RtspServer(file="scene.mp4", sub_file="scene-small.mp4") as server:  # pre-encoded, looping
        ...

Both can be stopped and started again on the same port, as a camera or NVR that restarts.
``RtspServer`` needs Debian's GStreamer RTSP server bindings, run by the system Python (which
has ``gi``); H.264 needs ``x264enc`` (plugins-ugly) and, for files, ``h264parse`` (plugins-bad)::

    apt-get install --no-install-recommends python3-gi gir1.2-gst-rtsp-server-1.0
        gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly
        gstreamer1.0-plugins-bad
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import numpy as np

from .procs import stop_process

__all__ = ["APT_PACKAGES", "MjpegServer", "RtspServer", "rtsp_available", "write_h264"]

_RTSP_SCRIPT = Path(__file__).with_name("_rtsp_server.py")
SYSTEM_PYTHON = "/usr/bin/python3"
APT_PACKAGES = (
    "python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good "
    "gstreamer1.0-plugins-ugly gstreamer1.0-plugins-bad")
# The GStreamer elements each kind of stream needs (``rtsp_available(codec=...)``).
_ELEMENTS = {"jpeg": ("videotestsrc", "videoconvert", "jpegenc", "rtpjpegpay"),
             "h264": ("videotestsrc", "videoconvert", "x264enc", "rtph264pay"),
             "h265": ("videotestsrc", "videoconvert", "x265enc", "rtph265pay"),
             "file": ("appsrc", "qtdemux", "h264parse", "rtph264pay")}


class MjpegServer:
    """HTTP MJPEG (``multipart/x-mixed-replace``) on ``127.0.0.1``, served from a thread.

    Every GET gets the stream; frames are JPEG-encoded once at start (a moving test pattern, or
    ``images`` in turn), so serving costs no CPU beyond the socket writes.

    Args:
        width, height: Size of the generated pattern (ignored with ``images``).
        fps: Frames per second sent to each client.
        images: BGR uint8 images to send in a cycle instead of the pattern.
        port: Port to listen on (``0``: a free one, kept across ``restart()``).
        boundary: The multipart boundary.
        max_clients: Concurrent clients; more get ``503``.
        cycle: How many distinct pattern frames to pre-encode.
    """

    def __init__(self, width: int = 320, height: int = 240, fps: float = 25.0,
                 images: Sequence[np.ndarray] | None = None, port: int = 0,
                 boundary: str = "edgeinferframe", max_clients: int = 8, cycle: int = 50) -> None:
        import cv2

        from ..sources.synthetic import TestPattern

        if images is None:
            pattern = TestPattern(width, height)
            images = [pattern.draw(i) for i in range(cycle)]
        self.jpegs = [bytes(cv2.imencode(".jpg", img)[1]) for img in images]
        self.host = "127.0.0.1"
        self.port = port
        self.fps = fps
        self.boundary = boundary
        self.max_clients = max_clients
        self.frames_sent = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stalled = threading.Event()
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/stream.mjpg"

    @property
    def clients(self) -> int:
        """Clients connected now."""
        with self._lock:
            return len(self._clients)

    def start(self) -> None:
        """Listen (on the same port as before after a ``stop()``) and serve in a thread."""
        if self._server is not None:
            return
        self._server = _Server((self.host, self.port), _MjpegHandler)
        self._server.owner = self
        self.port = int(self._server.server_address[1])
        self._stopping.clear()
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                         name=f"mjpeg-server-{self.port}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and cut every client off mid-stream, as a camera that goes away."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            for sock in self._clients:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        deadline = time.monotonic() + 5
        while self.clients and time.monotonic() < deadline:
            time.sleep(0.01)

    def restart(self, down_s: float = 0.0) -> None:
        """``stop()``, stay down ``down_s`` seconds, ``start()`` on the same port."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def stall(self) -> None:
        """Keep connections open but send nothing: a hung camera, not a dead one."""
        self._stalled.set()

    def resume(self) -> None:
        """Send frames again after ``stall()``."""
        self._stalled.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, handler: _MjpegHandler) -> None:
        sock = handler.connection
        with self._lock:
            if len(self._clients) >= self.max_clients:
                handler.send_error(503, "too many clients")
                return
            self._clients.add(sock)
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={self.boundary}")
            handler.send_header("Cache-Control", "no-cache")
            handler.send_header("Connection", "close")
            handler.end_headers()
            interval = 1.0 / self.fps
            due = time.monotonic()
            i = 0
            while not self._stopping.is_set():
                if self._stalled.is_set():
                    self._stopping.wait(0.02)
                    due = time.monotonic()
                    continue
                jpeg = self.jpegs[i % len(self.jpegs)]
                head = (f"--{self.boundary}\r\nContent-Type: image/jpeg\r\n"
                        f"Content-Length: {len(jpeg)}\r\n\r\n").encode()
                handler.wfile.write(head + jpeg + b"\r\n")
                handler.wfile.flush()
                self.frames_sent += 1
                i += 1
                # A client that reads slowly gets frames late, never a burst to catch up.
                due = max(due + interval, time.monotonic() - interval)
                delay = due - time.monotonic()
                if delay > 0:
                    self._stopping.wait(delay)
        except OSError:
            pass  # the client went away, or stop() cut it off
        finally:
            with self._lock:
                self._clients.discard(sock)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: MjpegServer


class _MjpegHandler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.owner._serve(self)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


def rtsp_available(python: str = SYSTEM_PYTHON, codec: str = "jpeg") -> str | None:
    """``None`` if ``RtspServer`` can run here, else why not (for a skip or an error message).

    ``codec``: ``jpeg`` (the default stream), ``h264`` or ``h265`` (encoded test pattern) or
    ``file`` (an MP4 file served as it is)."""
    if not os.path.exists(python):
        return f"{python} not found (Debian's python3 with gi runs the RTSP server)"
    probe = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0');"
             "from gi.repository import Gst, GstRtspServer; Gst.init(None);"
             f"missing = [e for e in {_ELEMENTS[codec]!r}"
             " if Gst.ElementFactory.find(e) is None];"
             "print(' '.join(missing))")
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}"
    if out.returncode != 0:
        why = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        return f"GStreamer RTSP server bindings missing ({why}); apt-get install {APT_PACKAGES}"
    if out.stdout.strip():
        return f"GStreamer elements missing: {out.stdout.strip()}; apt-get install {APT_PACKAGES}"
    return None


class RtspServer:
    """GStreamer's RTSP server (``gst-rtsp-server``) in a subprocess on ``127.0.0.1``.

    Serves ``videotestsrc`` at ``rtsp://127.0.0.1:<port>/test``: as MJPEG over RTP by default
    (``rtpjpegpay``: no H.264 encoder needed), as H.264 with ``codec="h264"`` (``x264enc``,
    baseline, a keyframe every ``gop`` frames), or an MP4 ``file``'s H.264 video as it is, looping
    in real time (no encoding while serving: a benchmark serves a pre-encoded scene). A second
    mount, ``sub_url``, serves a smaller pattern (``substream=(w, h)``) or ``sub_file``, as a
    camera's substream. ``stop()`` kills the server process (clients lose the stream);
    ``start()`` again serves on the same port.

    Args:
        width, height, fps: The pattern's mode (a file has its own).
        port: Port (``0``: a free one, chosen by the server and kept across restarts).
        mount: Path of the stream.
        python: The interpreter with GStreamer's ``gi`` bindings (Debian's ``/usr/bin/python3``).
        codec: ``jpeg``, ``h264`` or ``h265`` (``x265enc``, plugins-bad), for the pattern.
        gop: Frames from one keyframe to the next, H.264 pattern (``None``: ``fps``, 1 s).
        file: An MP4 (H.264 video) to serve on ``mount`` instead of the pattern, looping.
        substream: Also serve the pattern at this ``(width, height)`` on ``sub_mount``.
        sub_file: Serve this MP4 on ``sub_mount`` (instead of ``substream``'s pattern).
        sub_mount: Path of the substream.
    """

    def __init__(self, width: int = 320, height: int = 240, fps: int = 25, port: int = 0,
                 mount: str = "/test", python: str = SYSTEM_PYTHON, *, codec: str = "jpeg",
                 gop: int | None = None, file: str | os.PathLike[str] | None = None,
                 substream: tuple[int, int] | None = None,
                 sub_file: str | os.PathLike[str] | None = None, sub_mount: str = "/sub") -> None:
        if codec not in ("jpeg", "h264", "h265"):
            raise ValueError(f"codec {codec!r}: jpeg, h264 or h265")
        self.host = "127.0.0.1"
        self.port = port
        self.width, self.height, self.fps = width, height, fps
        self.mount = mount
        self.codec, self.gop = codec, gop
        self.file = Path(file).absolute() if file is not None else None
        self.substream = substream
        self.sub_file = Path(sub_file).absolute() if sub_file is not None else None
        self.sub_mount = sub_mount
        self.python = python if os.path.exists(python) else (shutil.which("python3") or sys.executable)
        self._proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"rtsp://{self.host}:{self.port}{self.mount}"

    @property
    def sub_url(self) -> str:
        """The substream's URL (served with ``substream`` or ``sub_file`` only)."""
        if self.substream is None and self.sub_file is None:
            raise ValueError("this server has no substream: give substream=(w, h) or sub_file")
        return f"rtsp://{self.host}:{self.port}{self.sub_mount}"

    def _command(self) -> list[str]:
        cmd = [self.python, str(_RTSP_SCRIPT), "--port", str(self.port), "--mount", self.mount,
               "--width", str(self.width), "--height", str(self.height), "--fps", str(self.fps),
               "--codec", self.codec, "--gop", str(self.gop or 0)]
        if self.file is not None:
            cmd += ["--file", str(self.file)]
        if self.substream is not None or self.sub_file is not None:
            cmd += ["--sub-mount", self.sub_mount]
        if self.substream is not None:
            cmd += ["--sub-width", str(self.substream[0]), "--sub-height", str(self.substream[1])]
        if self.sub_file is not None:
            cmd += ["--sub-file", str(self.sub_file)]
        return cmd

    def start(self, timeout_s: float = 20.0) -> None:
        """Start the server and wait until it listens; ``RuntimeError`` with its output if not."""
        if self._proc is not None:
            return
        proc = subprocess.Popen(self._command(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self._proc = proc
        lines: list[str] = []
        result: dict[str, int] = {}

        def read_ready() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("READY "):
                    result["port"] = int(line.split()[1])
                    break

        reader = threading.Thread(target=read_ready, daemon=True)
        reader.start()
        reader.join(timeout_s)
        if "port" not in result:
            self.stop()
            raise RuntimeError(f"RTSP server did not start: {''.join(lines)[-2000:]}")
        self.port = result["port"]
        # Drain the rest of its output so a chatty server can never block on a full pipe.
        threading.Thread(target=_drain, args=(proc,), daemon=True).start()

    def stop(self) -> None:
        """Kill the server: clients see the stream stop, as with a camera rebooting."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        stop_process(proc, 5)

    def restart(self, down_s: float = 0.0) -> None:
        """``stop()``, stay down ``down_s`` seconds, ``start()`` on the same port."""
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_h264(path: str | os.PathLike[str], images: Sequence[np.ndarray], fps: int = 15,
               gop: int | None = None, bframes: int = 0, slices: int | None = None) -> Path:
    """Encode BGR ``images`` (all one even size) as H.264 in MP4 at ``path`` with PyAV's
    libx264 (``ultrafast``; a keyframe every ``gop`` frames, default ``fps``; ``bframes``
    B-frames between references, as some cameras send; ``slices`` slices per picture, as many
    cameras send: ``None`` leaves it to libx264's slice threads, one slice per encoder thread,
    which depends on the machine's cores), for ``RtspServer(file=...)``. Needs PyAV (the
    ``rtsp`` extra)."""
    import av

    height, width = images[0].shape[:2]
    options = {"preset": "ultrafast", "g": str(gop or fps), "keyint_min": str(gop or fps),
               "bf": str(bframes)}
    if slices is not None:
        options["x264-params"] = f"slices={slices}"
    with av.open(str(path), "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=fps, options=options)
        if slices is not None:
            stream.codec_context.thread_count = 1  # else one slice per thread, whatever asked
        assert isinstance(stream, av.VideoStream)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for image in images:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return Path(path)


def _drain(proc: subprocess.Popen[str]) -> None:
    if proc.stdout is not None:
        for _ in proc.stdout:
            pass
