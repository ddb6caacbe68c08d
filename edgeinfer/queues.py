"""A small bounded queue for stage hand-offs: drop-oldest for live sources, blocking otherwise,
and closable so that the end of a stream (or an error) flows through the stages in order."""

from __future__ import annotations

import threading
from collections import deque
from typing import Any


class Closed(Exception):
    """The queue is closed (and, for ``get``, empty)."""


class DropOldestQueue:
    """Bounded FIFO. With ``drop=True`` a full queue drops its oldest item to take a new one
    (``put`` returns ``True`` when it dropped); with ``drop=False`` ``put`` waits for room.

    ``close()`` lets consumers drain what is queued, then ``get`` raises ``Closed``; ``put`` on a
    closed queue raises ``Closed``.
    """

    __slots__ = ("_items", "_size", "_drop", "_cond", "_closed")

    def __init__(self, size: int, *, drop: bool) -> None:
        if size < 1:
            raise ValueError("queue size must be at least 1")
        self._items: deque[Any] = deque()
        self._size = size
        self._drop = drop
        self._cond = threading.Condition(threading.Lock())
        self._closed = False

    def put(self, item: Any) -> bool:
        with self._cond:
            if self._closed:
                raise Closed
            dropped = False
            if len(self._items) >= self._size:
                if self._drop:
                    self._items.popleft()
                    dropped = True
                else:
                    while len(self._items) >= self._size and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        raise Closed
            self._items.append(item)
            self._cond.notify_all()
            return dropped

    def get(self, timeout: float | None = None) -> Any:
        with self._cond:
            while not self._items:
                if self._closed:
                    raise Closed
                if not self._cond.wait(timeout) and timeout is not None:
                    raise TimeoutError
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed
