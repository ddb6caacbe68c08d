"""The inference thread of a model shared by several pipelines (``model/pool.py``): which of the
frames waiting runs next, alone or in a batch with others.

At most one frame per client waits (each pipeline's infer stage submits one and waits for it).
The thread serves the clients with a frame waiting round-robin, so a camera flooding the model
cannot starve a slow one. Where the ``Batcher`` decided to batch, it takes up to B waiting
frames in that order, waiting at most ``batch_window_ms`` for clients whose frame has not come
yet, runs those that fit the batch as one (frames of another shape run on their own) and hands
each client its row; a batch that raises is retried frame by frame, so a bad frame costs only
its own pipeline. What one run means (a crashed worker revived, errors kept for the caller) is
the subclass's ``execute``.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from ..runtime.batching import Feeds
from .batching import Batcher


class Client(Hashable, Protocol):
    """What the scheduler counts on a client (a ``SharedModel`` handle)."""

    runs: int
    last_wait_ms: float
    max_waited_runs: int


C = TypeVar("C", bound=Client)


@dataclass(slots=True)
class Request:
    """One frame of one client, waiting or run."""

    feeds: Any
    queued: float
    runs_before: int  # the model's run count when it was queued
    done: threading.Event = field(default_factory=threading.Event)
    outputs: dict[str, np.ndarray] | None = None
    error: BaseException | None = None
    crash_gen: int | None = None  # the worker generation a crash happened in


class Scheduler(ABC, Generic[C]):
    """Round-robin, and batches where decided, over the clients with a request waiting.

    Attributes:
        clients: In the order they came (the round-robin's order).
        runs: Frames run so far (a batch counts its frames).
        batcher: Decides and runs the batches.
        cond: Guards ``clients`` and the waiting requests.
        run_lock: One run at a time, whichever thread runs it.
    """

    def __init__(self, batcher: Batcher, thread_name: str) -> None:
        self.batcher = batcher
        self.clients: list[C] = []
        self.runs = 0
        self.cond = threading.Condition()
        self.run_lock = threading.Lock()
        self._thread_name = thread_name
        self._pending: dict[C, Request] = {}
        self._next = 0  # where the round-robin looks first
        self._thread: threading.Thread | None = None
        self.stopping = False

    @abstractmethod
    def execute(self, client: C, request: Request) -> None:
        """Run one request (holding ``run_lock``); set its outputs or error and ``done``."""

    def started(self, client: C, request: Request) -> None:
        """Count what ``request`` waited for, as it starts running."""
        client.last_wait_ms = (time.perf_counter() - request.queued) * 1000
        client.max_waited_runs = max(client.max_waited_runs, self.runs - request.runs_before)

    def enqueue(self, client: C, request: Request) -> None:
        """(Under ``cond``.) Hand ``request`` to the inference thread."""
        self._pending[client] = request
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, daemon=True,
                                            name=self._thread_name)
            self._thread.start()
        self.cond.notify_all()

    def withdraw(self, client: C) -> Request | None:
        """(Under ``cond``.) Take back ``client``'s waiting request, if any."""
        return self._pending.pop(client, None)

    def stop(self, timeout: float) -> None:
        """Serve what waits, then end the inference thread; the batch session is closed."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self.run_lock:
            self.batcher.close()

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self._pending and not self.stopping:
                    self.cond.wait()
                if not self._pending:
                    return
                sharers = len(self.clients)
                first = self._take()
            if self.batcher.due(sharers):
                with self.run_lock:  # measured with the waiting frame; the others wait
                    self.batcher.decide(sharers, first[1].feeds)
            group = self._gather(first)
            with self.run_lock:
                self._run_group(group)

    def _take(self) -> tuple[C, Request]:
        client = self._pick()
        return client, self._pending.pop(client)

    def _pick(self) -> C:
        n = len(self.clients)
        for i in range(n):
            at = (self._next + i) % n
            client = self.clients[at]
            if client in self._pending:
                self._next = (at + 1) % n
                return client
        return next(iter(self._pending))  # a client that left meanwhile

    def _gather(self, first: tuple[C, Request]) -> list[tuple[C, Request]]:
        """``first`` and, when batching, up to B - 1 more waiting requests in round-robin
        order, waiting at most ``batch_window_ms`` for clients whose frame has not come yet."""
        limit = self.batcher.limit
        group = [first]
        if limit < 2:
            return group
        deadline = time.perf_counter() + self.batcher.policy.window_ms / 1000
        with self.cond:
            while len(group) < limit:
                if self._pending:
                    group.append(self._take())
                    continue
                left = deadline - time.perf_counter()
                if left <= 0 or self.stopping or len(group) >= len(self.clients):
                    break
                self.cond.wait(left)
        return group

    def _run_group(self, group: list[tuple[C, Request]]) -> None:
        """(Holding ``run_lock``.) As one batch where enough frames fit it, the others one by
        one; a batch that raises is retried one by one."""
        batch: list[tuple[C, Request]] = []
        rows: list[Feeds] = []
        alone: list[tuple[C, Request]] = []
        for client, request in group:
            row = self.batcher.row(request.feeds) if len(group) > 1 else None
            if row is None:
                alone.append((client, request))
            else:
                batch.append((client, request))
                rows.append(row)
        if len(batch) < max(2, self.batcher.min_frames):
            alone, batch = group, []
        if batch:
            for client, request in batch:
                self.started(client, request)
            try:
                outputs = self.batcher.run(rows)
            except Exception as exc:  # one bad frame must cost only its own pipeline
                self.batcher.failed(exc)
                alone = batch + alone
            else:
                for (client, request), out in zip(batch, outputs, strict=True):
                    request.outputs = out
                    self.runs += 1
                    client.runs += 1
                    request.done.set()
        for client, request in alone:
            self.execute(client, request)
