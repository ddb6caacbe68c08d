"""Real stand-ins for sensors, for tests and smoke checks of the audio, serial and mqtt sources.

- ``pcm_command(...)``: a command (``python -c ...``) that writes PCM to stdout, as ``arecord``
  would: a sine wave or a raw file, in chunks, then exits with a chosen code or holds on.
- ``PtySensor``: a line-based serial sensor on a pseudo-terminal; pyserial opens ``.port``;
  ``unplug()``/``plug()`` make the device vanish and come back (behind a stable symlink).
- ``paho_subscriber(host, port)``: the ``subscribe`` callable the ``mqtt`` source takes, on a
  paho-mqtt 2.x client (it can also ``publish``).
- ``take(source, n)``: the first ``n`` frames of an entered source, bounded in time.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import tty
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

__all__ = ["PahoSubscriber", "PtySensor", "paho_subscriber", "pcm_command", "take"]

_PCM_SCRIPT = r"""
import array, json, math, signal, sys, time
o = json.loads(sys.argv[1])
if o["ignore_term"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if o["file"]:
    with open(o["file"], "rb") as f:
        data = f.read()
else:
    rate, ch, amp = o["rate"], o["channels"], o["amplitude"]
    v = [amp * math.sin(2 * math.pi * o["hz"] * i / rate)
         for i in range(int(o["seconds"] * rate)) for _ in range(ch)]
    code, to = {"s16le": ("h", lambda x: int(x * 32767)), "s32le": ("i", lambda x: int(x * 2147483647)),
                "f32le": ("f", float), "u8": ("B", lambda x: int(x * 127 + 128))}[o["format"]]
    a = array.array(code, map(to, v))
    if sys.byteorder == "big":
        a.byteswap()
    data = a.tobytes()
data += b"\0" * o["extra_bytes"]
out = sys.stdout.buffer
try:
    for i in range(0, len(data), o["chunk"]):
        out.write(data[i:i + o["chunk"]])
        out.flush()
        if o["interval"]:
            time.sleep(o["interval"])
    if o["stderr"]:
        sys.stderr.write(o["stderr"] + "\n")
        sys.stderr.flush()
    while o["hold"]:
        time.sleep(0.1)
except BrokenPipeError:
    sys.exit(1)
sys.exit(o["exit_code"])
"""


def take(source: Any, n: int, timeout_s: float = 10.0,
         until: Callable[[list[Any]], bool] | None = None) -> list[Any]:
    """Iterate an entered source until ``n`` frames (or ``until(frames)`` is true); after
    ``timeout_s`` the source is stopped, so a test never hangs on a stream that went quiet.

    Returns:
        The frames read (fewer than ``n`` if it stopped or ended first).
    """
    timer = threading.Timer(timeout_s, source.stop)
    timer.daemon = True
    timer.start()
    frames: list[Any] = []
    try:
        for frame in source:
            frames.append(frame)
            if len(frames) >= n or (until is not None and until(frames)):
                break
    finally:
        timer.cancel()
    return frames


def pcm_command(*, file: str | os.PathLike[str] | None = None, hz: float = 440.0,
                seconds: float = 1.0, sample_rate: int = 16000, channels: int = 1,
                sample_format: str = "s16le", amplitude: float = 0.5, chunk: int = 4096,
                interval_s: float = 0.0, extra_bytes: int = 0, exit_code: int = 0,
                stderr: str = "", hold: bool = False, ignore_term: bool = False) -> list[str]:
    """A command that writes PCM to stdout like ``arecord -t raw`` (stdlib Python only).

    Args:
        file: Write this file's bytes (raw PCM) instead of a sine wave.
        hz, seconds, sample_rate, channels, sample_format, amplitude: The sine wave (every
            channel the same).
        chunk: Bytes per write; interval_s: sleep between writes (a paced device).
        extra_bytes: Zero bytes appended (a stream that ends in a partial sample).
        exit_code: Exit with this status when done; stderr: a line written to stderr first.
        hold: Keep running after the data (until terminated); ignore_term: ignore SIGTERM.
    """
    opts = {"file": os.fspath(file) if file is not None else None, "hz": hz, "seconds": seconds,
            "rate": sample_rate, "channels": channels, "format": sample_format,
            "amplitude": amplitude, "chunk": chunk, "interval": interval_s,
            "extra_bytes": extra_bytes, "exit_code": exit_code, "stderr": stderr, "hold": hold,
            "ignore_term": ignore_term}
    return [sys.executable, "-c", _PCM_SCRIPT, json.dumps(opts)]


class PtySensor:
    """A serial sensor on a pseudo-terminal in raw mode.

    Args:
        link: A symlink to keep pointing at the current pty, so that a replugged sensor has the
            same ``port`` (as a udev rule gives ``/dev/serial/by-id/...``). ``None``: ``port`` is
            the pty's own path, which disappears for good on ``unplug()``.
    """

    def __init__(self, link: str | os.PathLike[str] | None = None) -> None:
        self._link = Path(link) if link is not None else None
        self._lock = threading.Lock()
        self._master = -1
        self._slave = -1
        self._path = ""
        self.plug()

    @property
    def port(self) -> str:
        """What to open: the symlink, or the pty's path."""
        return str(self._link) if self._link is not None else self._path

    @property
    def plugged(self) -> bool:
        return self._master >= 0

    def plug(self) -> None:
        """Create a fresh pty (and point the link at it)."""
        with self._lock:
            if self._master >= 0:
                return
            master, slave = os.openpty()
            tty.setraw(slave)  # no echo back into a master nobody reads, no line editing
            self._master, self._slave, self._path = master, slave, os.ttyname(slave)
            if self._link is not None:
                tmp = self._link.with_name(self._link.name + ".new")
                tmp.unlink(missing_ok=True)
                tmp.symlink_to(self._path)
                tmp.replace(self._link)

    def unplug(self) -> None:
        """Close the pty: a reader gets an I/O error, reopening fails until ``plug()``."""
        with self._lock:
            if self._link is not None:
                self._link.unlink(missing_ok=True)
            for fd in (self._master, self._slave):
                if fd >= 0:
                    os.close(fd)
            self._master = self._slave = -1

    def write(self, data: bytes | str) -> None:
        """Write raw bytes (no newline added)."""
        raw = data.encode() if isinstance(data, str) else data
        with self._lock:
            if self._master < 0:
                raise OSError("the sensor is unplugged")
            os.write(self._master, raw)

    def write_lines(self, lines: Iterable[bytes | str]) -> None:
        """Write each line followed by ``\\n``."""
        for line in lines:
            self.write((line.encode() if isinstance(line, str) else line) + b"\n")

    def stream(self, lines: Iterable[bytes | str], interval_s: float = 0.0,
               stop: threading.Event | None = None) -> threading.Thread:
        """Write ``lines`` from a daemon thread, ``interval_s`` apart; it ends early when the
        sensor is unplugged or ``stop`` is set."""
        stop = stop or threading.Event()

        def run() -> None:
            for line in lines:
                if stop.is_set():
                    return
                try:
                    self.write_lines([line])
                except OSError:
                    return
                if interval_s:
                    stop.wait(interval_s)

        thread = threading.Thread(target=run, name="pty-sensor", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.unplug()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PahoSubscriber:
    """``subscribe(topic, qos, on_payload) -> unsubscribe`` on a paho-mqtt 2.x client, connected
    on construction; ``subscribe`` returns once the broker acknowledged it.

    Args:
        host, port: The broker.
        timeout_s: How long connecting, subscribing or publishing may take.
    """

    def __init__(self, host: str, port: int, timeout_s: float = 5.0) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self._timeout = timeout_s
        self._cond = threading.Condition()
        self._acked: set[int] = set()
        self._connected = False
        client = mqtt.Client(CallbackAPIVersion.VERSION2,
                             client_id=f"edgeinfer-test-{uuid.uuid4().hex[:8]}")
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_ack
        client.on_unsubscribe = self._on_ack
        self._client = client
        client.connect(host, port, keepalive=30)
        client.loop_start()
        if not self._wait(lambda: self._connected):
            self.close()
            raise TimeoutError(f"no MQTT connection to {host}:{port} within {timeout_s} s")

    def __call__(self, topic: str, qos: int, on_payload: Callable[[bytes], None]
                 ) -> Callable[[], None]:
        def on_message(client: Any, userdata: Any, msg: Any) -> None:
            on_payload(msg.payload)

        self._client.message_callback_add(topic, on_message)
        _, mid = self._client.subscribe(topic, qos)
        if not self._wait(lambda: mid in self._acked):
            raise TimeoutError(f"subscribing to {topic!r} was not acknowledged")

        def unsubscribe() -> None:
            self._client.unsubscribe(topic)
            self._client.message_callback_remove(topic)

        return unsubscribe

    def publish(self, topic: str, payload: bytes | str, qos: int = 1) -> None:
        """Publish and wait until it is sent (QoS 0) or acknowledged (QoS 1)."""
        self._client.publish(topic, payload, qos).wait_for_publish(self._timeout)

    def close(self) -> None:
        self._client.disconnect()
        self._client.loop_stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any
                    ) -> None:
        with self._cond:
            self._connected = not reason.is_failure
            self._cond.notify_all()

    def _on_ack(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        with self._cond:
            self._acked.add(mid)
            self._cond.notify_all()

    def _wait(self, predicate: Callable[[], bool]) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, self._timeout)


def paho_subscriber(host: str, port: int, timeout_s: float = 5.0) -> PahoSubscriber:
    """A connected ``PahoSubscriber``: pass it as ``subscribe=`` to the ``mqtt`` source; close
    it (or use it as a context manager) when done."""
    return PahoSubscriber(host, port, timeout_s)
