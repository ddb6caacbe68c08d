"""The capture process: ``python -m edgeinfer.sources.capture_child FD MEMFD``.

It opens one live source (the ``camera`` a ``ProcessSource`` stands for, ``isolated.py``),
reads, demuxes and decodes it, and hands each frame to the parent through the shared-memory
ring (``framering.py``): the pixels go into a slot, a fixed 60-odd-byte header goes over the
socket. Everything else is a pickled tuple, rare next to frames: the source's stats and health
every ``STATS_S``, its log records, the camera's own packets when a clip recorder asked for
them (``("packet", ...)``, ``("reset", info)``), a ``SourceError`` (``("error", text)``) and
the end of the stream (``("end",)``).

The parent starts it when the pipeline is built (its path, then the config), and sends
``("open", packets wanted)`` when the pipeline starts; ``("stop",)``, or closing the socket,
ends it.
"""

from __future__ import annotations

import logging
import pickle
import struct
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from .._child import Forward, die_with_parent, keep_frames_in_the_heap
from .._importer import resolve
from ..errors import EdgeInferError
from . import open_source
from .cameras import CAMERA_READERS
from .framering import LOW_FREE, RingWriter
from .packets import PacketRing, StreamInfo

__all__ = ["FRAME", "STATS_S"]

STATS_S = 0.5
_READERS = {**CAMERA_READERS, "video": "edgeinfer.sources.files:VideoSource"}
_WAIT_S = 0.001  # a file's frame waits this long at a time for a free slot (nothing skipped)
# b"F", slot, region offset, index, ts, wall, start (NaN: none), ndim, shape (3), display (2)
FRAME = struct.Struct("<cIQqdddB3I2I")


class _ForwardRing(PacketRing):
    """The camera's packets, sent to the parent's ring (the clip recorder's) as they come."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self._send = send

    @property
    def wanted(self) -> bool:
        return True

    def reset(self, info: StreamInfo) -> None:
        super().reset(info)  # ``info`` says which stream the packets are of (holds none)
        self._send(("reset", info))

    def push(self, data: bytes, pts: int, dts: int | None, clock: float, keyframe: bool
             ) -> None:
        self._send(("packet", bytes(data), pts, dts, clock, keyframe))


def _child(fd: int, memfd: int) -> int:
    die_with_parent()
    keep_frames_in_the_heap()
    conn = Connection(fd)
    for entry in pickle.loads(conn.recv_bytes()):  # the parent's path: plug-in sources import
        if entry not in sys.path:
            sys.path.append(entry)
    init: dict[str, Any] = pickle.loads(conn.recv_bytes())
    lock = threading.Lock()  # the main stream's demux thread and the stats thread send too
    logging.getLogger().handlers[:] = [Forward(conn, lock)]
    logging.raiseExceptions = False  # a record sent after the parent went: not a traceback
    logging.getLogger("edgeinfer").setLevel(init["log_level"])
    # Started when the pipeline is built: the reader's imports (OpenCV, PyAV) are done before
    # the pipeline starts and says "open", so the first frame comes no later than in-process.
    resolve(_READERS, init["reader"], "reader")
    try:
        order = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return 0
    if order[0] != "open":
        return 0

    def send(message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message)
        with lock:
            conn.send_bytes(data)

    config = msgspec.structs.replace(init["config"], isolation="thread")
    source = open_source(config, packets=_ForwardRing(send) if order[1] else None)
    writer = RingWriter(memfd, init["ring_bytes"])
    full = [0]
    done = threading.Event()

    def listen() -> None:  # the parent's stop, or the parent gone
        try:
            while not done.is_set():
                if pickle.loads(conn.recv_bytes())[0] == "stop":
                    break
        except (EOFError, OSError):
            pass
        source.stop()

    def report() -> None:
        while not done.wait(STATS_S):
            try:
                _report(send, source, full[0], None)
            except OSError:
                return

    threading.Thread(target=listen, daemon=True, name="edgeinfer-capture-listen").start()
    try:
        source.__enter__()  # the first attempt to open, as in-process: the parent waits for it
    except EdgeInferError as exc:  # a config that cannot work here: the parent raises it
        _report(send, source, 0, ("error", str(exc)))
        return 0
    try:
        _report(send, source, 0, ("opened",))
        threading.Thread(target=report, daemon=True, name="edgeinfer-capture-stats").start()
        last = _frames(source, writer, conn, lock, send, full)
    except (EOFError, OSError):
        return 0  # the parent is gone
    finally:
        done.set()
        source.__exit__(None, None, None)
    _report(send, source, full[0], last)
    return 0


def _frames(source: Any, writer: RingWriter, conn: Connection, lock: threading.Lock,
            send: Any, full: list[int]) -> tuple[Any, ...]:
    """Hand every frame to the parent; the last message: the end, or why the camera gave up."""
    pack = FRAME.pack
    nan = float("nan")
    said = source.health()
    # A file waits until LOW_FREE slots are free; the reader copies a frame out when fewer
    # would be left, so a reader holding every frame still lets the file go on.
    reserve = 1 if source.live else LOW_FREE
    try:
        for frame in source:
            health = source.health()
            if health != said:  # the parent's view of it follows at once, not at the next tick
                said = health
                _report(send, source, full[0], None)
            data = frame.data
            placed = writer.put(data, reserve)
            while placed is None and not source.live and not source.stopped:
                time.sleep(_WAIT_S)  # a file waits for the pipeline, a camera does not
                placed = writer.put(data, reserve)
            if placed is None:
                full[0] += 1
                continue
            slot, fresh = placed
            layout = writer.layout
            assert layout is not None
            if fresh:
                send(("layout", layout.offset, layout.slots, layout.slot_bytes))
            shape = data.shape + (0,) * (3 - data.ndim)
            display = frame.display or (0, 0)
            header = pack(b"F", slot, layout.offset, frame.index, frame.ts, frame.wall,
                          nan if frame.start is None else frame.start, data.ndim, *shape,
                          *display)
            with lock:
                conn.send_bytes(header)
    except EdgeInferError as exc:  # a camera that gave up: the parent raises it
        return ("error", str(exc))
    return ("end",)


def _report(send: Any, source: Any, full: int, last: tuple[Any, ...] | None) -> None:
    """The source's stats and health, then ``last`` if any; a parent already gone is not
    told."""
    health = source.health()
    try:
        send(("stats", source.stats.to_dict(), health.to_dict() if health else None,
              source.waiting, full))
        if last is not None:
            send(last)
    except OSError:
        pass


if __name__ == "__main__":  # pragma: no cover - the child's entry point
    sys.exit(_child(int(sys.argv[1]), int(sys.argv[2])))
