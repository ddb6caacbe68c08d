"""The fleet collector's queue: device messages and rejected ones in two lanes, bounded by
count and, together, by bytes (see `edgeinfer.fleet.collector`)."""

from __future__ import annotations

import threading
from collections import deque

from .records import Delivery

__all__ = ["Lanes", "delivery_size"]

_DELIVERY_OVERHEAD = 512  # bytes a message costs beyond its payload and topic (objects, token)


class Lanes:
    """The collector's queue: two FIFO lanes, device messages and rejected ones, each
    bounded by count, both together by the bytes held (queued, and taken by the writer until it
    `release`\\s them after the commit). The writer takes device messages first, so they never
    wait behind a flood of junk. When nothing is held one message is let in whatever its size."""

    def __init__(self, count: int, nbytes: int) -> None:
        self._lanes: tuple[deque[tuple[Delivery, int]], deque[tuple[Delivery, int]]] = (
            deque(), deque())
        self._count, self._bytes = count, nbytes
        self._cond = threading.Condition()
        self.held = 0

    def put(self, delivery: Delivery, size: int, timeout: float) -> bool:
        """Queue ``delivery`` (``size`` bytes) in its lane; ``False`` if it did not fit within
        ``timeout`` s."""
        lane = self._lanes[delivery.record is None]

        def fits() -> bool:
            return self.held == 0 or (len(lane) < self._count
                                      and self.held + size <= self._bytes)

        with self._cond:
            if not self._cond.wait_for(fits, timeout):
                return False
            lane.append((delivery, size))
            self.held += size
            self._cond.notify_all()
            return True

    def get(self, timeout: float, *, only_devices: bool = False) -> tuple[Delivery, int] | None:
        """The next message, a device's first (``only_devices``: only those); ``None`` after
        ``timeout`` s without one."""
        lanes = self._lanes[:1] if only_devices else self._lanes
        with self._cond:
            if not self._cond.wait_for(lambda: any(lanes), timeout):
                return None
            self._cond.notify_all()  # room in a lane for a waiting `put`
            return next(lane for lane in lanes if lane).popleft()

    def take_rejected(self, most: int, nbytes: int) -> list[tuple[Delivery, int]]:
        """Up to ``most`` rejected messages of ``nbytes`` queued now, without waiting."""
        lane, size = self._lanes[1], 0
        out: list[tuple[Delivery, int]] = []
        with self._cond:
            while lane and len(out) < most and size + lane[0][1] <= nbytes:
                out.append(lane.popleft())
                size += out[-1][1]
            self._cond.notify_all()
        return out

    def release(self, size: int) -> None:
        """The writer is done with messages of ``size`` bytes (committed or given up)."""
        with self._cond:
            self.held -= size
            self._cond.notify_all()

    def depth(self) -> tuple[int, int]:
        """Messages queued in each lane (device messages, rejected ones)."""
        with self._cond:
            return len(self._lanes[0]), len(self._lanes[1])


def delivery_size(delivery: Delivery) -> int:
    if delivery.record is not None:
        record = delivery.record
        return len(record.payload) + len(record.topic) + _DELIVERY_OVERHEAD
    parked = delivery.rejection
    return _DELIVERY_OVERHEAD + (len(parked.payload) + len(parked.topic) if parked else 0)
