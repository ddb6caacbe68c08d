"""Cameras that lie to the ``camera`` source through PyAV, and what its health says (issue 31
item 11): one that completes PLAY and then never sends RTP (the real GStreamer RTSP server behind
a proxy that passes its RTSP replies and drops every interleaved packet) must never read as
working; one whose replies trickle in a byte at a time is a slow or incomplete reply, not a
camera missing from the network."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.pipeline import Pipeline
from edgeinfer.sources import open_source
from edgeinfer.testing.streams import APT_PACKAGES, RtspServer, rtsp_available

pytest.importorskip("av", reason="PyAV is not installed (pip install 'edgeinfer[rtsp]')")


class _Listener:
    """A TCP server on loopback: ``serve(client)`` in a thread per connection."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        self.stop = threading.Event()
        self.clients: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.clients.append(client)
            threading.Thread(target=self._run, args=(client,), daemon=True).start()

    def _run(self, client: socket.socket) -> None:
        try:
            self.serve(client)
        except OSError:
            pass
        finally:
            client.close()

    def serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for c in self.clients:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class MuteProxy(_Listener):
    """Passes RTSP requests to ``upstream`` and its RTSP replies back, whole; drops every
    interleaved (``$``) RTP and RTCP packet: a camera that answers PLAY and sends nothing."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.plays = 0
        self.dropped = 0
        super().__init__()

    def serve(self, client: socket.socket) -> None:
        up = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
        self.clients.append(up)
        threading.Thread(target=self._requests, args=(client, up), daemon=True).start()
        up.settimeout(None)
        buf = b""
        while not self.stop.is_set():
            data = up.recv(65536)
            if not data:
                return
            buf += data
            while buf:
                if buf[:1] == b"$":  # interleaved: $, channel, 16-bit length
                    if len(buf) < 4 or len(buf) < 4 + int.from_bytes(buf[2:4], "big"):
                        break
                    buf = buf[4 + int.from_bytes(buf[2:4], "big"):]
                    self.dropped += 1
                    continue
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                length = 0
                for line in buf[:end].split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                whole = end + 4 + length
                if len(buf) < whole:
                    break
                client.sendall(buf[:whole])
                buf = buf[whole:]

    def _requests(self, client: socket.socket, up: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                self.plays += data.count(b"PLAY ")
                up.sendall(data)
        except OSError:
            pass
        finally:
            up.close()


class TrickleServer(_Listener):
    """Answers every request with a valid RTSP reply, one byte every ``gap_s``."""

    REPLY = b"RTSP/1.0 200 OK\r\nCSeq: 1\r\nPublic: OPTIONS, DESCRIBE, SETUP, PLAY\r\n\r\n"

    def __init__(self, gap_s: float = 0.1) -> None:
        self.gap_s = gap_s
        self.sent = 0
        super().__init__()

    def serve(self, client: socket.socket) -> None:
        client.recv(4096)
        for i in range(len(self.REPLY)):
            if self.stop.wait(self.gap_s):
                return
            client.sendall(self.REPLY[i:i + 1])
            self.sent += 1


@pytest.fixture(scope="module")
def h264() -> Iterator[RtspServer]:
    why = rtsp_available(codec="h264")
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(f"RTSP server unavailable in CI: {why}")
        pytest.skip(f"RTSP server unavailable: {why} (apt-get install {APT_PACKAGES})")
    with RtspServer(width=160, height=120, fps=15, codec="h264") as server:
        yield server


def test_a_camera_that_answers_play_and_sends_no_rtp_never_reads_as_running(
        h264: RtspServer) -> None:
    proxy = MuteProxy(h264.port)
    config = CameraConfig(uri=f"rtsp://127.0.0.1:{proxy.port}/test", backend="pyav",
                          open_timeout_s=1.0,
                          reconnect=ReconnectConfig(initial_s=0.05, max_s=0.1))
    samples: list[tuple[str, str] | None] = []
    try:
        with open_source(config) as source:
            frames: list[object] = []
            reader = threading.Thread(target=lambda: frames.extend(source), daemon=True)
            reader.start()
            deadline = time.monotonic() + 20
            # Sample from the start through two lost connections (each after PLAY).
            while source.stats.errors < 2 and time.monotonic() < deadline:
                health = source.health()
                samples.append((health.state, health.reason) if health is not None else None)
                time.sleep(0.005)
            source.stop()
            reader.join(10)
        last = source.health()
    finally:
        proxy.close()
    assert proxy.plays >= 2 and proxy.dropped > 0 and not frames
    assert source.stats.errors >= 2, samples[-1]
    running = [s for s in samples if s is None or s[0] == "running" or not s[1]]
    assert not running, f"{len(running)} of {len(samples)} samples read as running"
    assert last is not None and last.state == "no_source"  # after two failures
    assert last.reason.startswith("no RTP arrived in ") and "since PLAY" in last.reason
    states = {s[0] for s in samples if s is not None}
    assert states <= {"starting", "no_source"}, states
    assert f"127.0.0.1:{proxy.port} answered the RTSP requests but sends no video" in last.reason
    assert "no RTP arrived" in source.stats.last_error


def test_a_trickling_reply_is_a_slow_camera_not_a_missing_one() -> None:
    server = TrickleServer(gap_s=0.1)
    config = CameraConfig(uri=f"rtsp://127.0.0.1:{server.port}/x", backend="pyav",
                          open_timeout_s=1.0, reconnect=ReconnectConfig(max_attempts=1))
    try:
        t0 = time.monotonic()
        with open_source(config) as source:
            health = source.health()
        took = time.monotonic() - t0
    finally:
        server.close()
    assert server.sent > 0 and took < 10
    assert health is not None and health.state == "no_source"
    assert health.reason.startswith(
        f"slow or incomplete reply from the camera at 127.0.0.1:{server.port}: "), health.reason
    assert "is the camera on this network" not in health.reason
    assert "raise open_timeout_s" in health.reason


def test_a_pipeline_on_a_camera_that_sends_no_rtp_never_reads_as_running(
        h264: RtspServer, blazeface_path: Path, tmp_path: Path) -> None:
    """The state every surface shows (``Pipeline.health``: ``/v1/pipelines``, the status
    topic), sampled from ``start()`` through two connections lost after PLAY."""
    proxy = MuteProxy(h264.port)
    config = {"runtime": {"state_dir": str(tmp_path / "state")}, "pipelines": [{
        "name": "cam", "source": {"type": "camera", "backend": "pyav",
                                  "uri": f"rtsp://127.0.0.1:{proxy.port}/test",
                                  "open_timeout_s": 1,
                                  "reconnect": {"initial_s": 0.05, "max_s": 0.1}},
        "model": {"path": str(blazeface_path), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "blazeface"}, "sinks": []}]}
    path = tmp_path / "cam.json"
    path.write_text(json.dumps(config))
    pipe = Pipeline.from_config(str(path))
    samples = []
    try:
        pipe.start()
        deadline = time.monotonic() + 20
        while pipe.source.stats.errors < 2 and time.monotonic() < deadline:
            samples.append(pipe.health())
            time.sleep(0.005)
    finally:
        pipe.close()
        proxy.close()
    assert pipe.source.stats.errors >= 2 and pipe.stats.processed == 0
    running = [h for h in samples if h.ok or not h.reason]
    assert not running, f"{len(running)} of {len(samples)} samples: {running[0]}"
    assert any("no RTP arrived" in h.reason for h in samples)
