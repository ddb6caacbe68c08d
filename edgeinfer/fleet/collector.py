"""The fleet collector's core: a source's deliveries go into a queue bounded by count
(``batch.queue``) and bytes (``batch.queue_bytes``, the batch in hand included: the collector's
memory for messages), in two lanes, device messages ahead of rejected ones; one writer thread
groups them into batches (``batch.max_rows`` messages or ``batch.max_age_s`` of age), writes
each batch in one database transaction and only then acknowledges it to the source, in
delivery order within each lane. A message is therefore acknowledged only once its row is committed (or it was
rejected as not a device message): a collector killed at any point loses nothing, and what it
had not acknowledged comes again (the database drops duplicates by key).

Two kinds of failure, kept apart. When the *database* fails (connection, timeout,
serialization: `StorageError`, and a probe, ``SELECT 1`` on a fresh connection, fails too), the
writer keeps the batch, backs off, and writes it again until it succeeds or the collector is
stopped; nothing is acknowledged meanwhile, and the full queue
holds the source back (backpressure reaches the broker). When the *data* fails (the database
or the driver refuses a value: `StorageDataError`; or the same batch failed twice while the
database answered the probe after each, as when a statement makes the server drop the
connection), retrying cannot help: the writer splits the
batch in halves until it has the rows that fail, parks each in the ``rejected`` table with the
database's reason, writes the rest and acknowledges them all. Messages the source could not
parse arrive already rejected and are parked the same way. No single message stalls the fleet.

A source whose receiving thread died (`Source.failure`) or a writer that raised ends `run` with
the error (the CLI exits non-zero): never a collector that is up but deaf.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import SourceError, StorageDataError, StorageError
from .db import WriteResult
from .lanes import Lanes, delivery_size
from .records import Delivery, Record, Rejection, rejection

if TYPE_CHECKING:
    from ..config.collect import CollectConfig
    from .db import Database

__all__ = ["Collector", "Source"]

logger = logging.getLogger(__name__)

_LAG_SAMPLES = 8192  # recent messages the lag quantiles are taken over
_RATE_WINDOW_S = 10.0
_MAINTAIN_EVERY_S = 3600.0
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0
_BATCH_FAULT_TRIES = 2  # failures of one batch, the database answering after each: the batch's
# Rejected messages per transaction, and their bytes: ~40 ms of upserts here (measured), the
# most a genuine result waits for junk inside the collector.
_REJECTED_BATCH, _REJECTED_BATCH_BYTES = 500, 2 * 2**20

class Source(Protocol):
    """Where messages come from (`MqttSource`, `NatsSource`)."""

    def start(self, deliver: Callable[[Delivery], None]) -> None:
        """Start receiving; ``deliver`` is called for each message and may block."""

    def ack(self, tokens: Sequence[Any]) -> None:
        """Acknowledge messages after their commit, in delivery order within each lane
        (device messages, rejected ones; writer thread)."""

    def stop(self) -> None:
        """Stop receiving and disconnect."""

    def stats(self) -> dict[str, Any]:
        """The source's own counters."""

    def failure(self) -> str | None:
        """Why the source stopped receiving for good (a thread of its own died); ``None``
        while it works (a lost connection it is retrying is no failure)."""


class _Nothing:
    results = events = statuses = duplicates = rejected_dropped = statuses_truncated = 0


class _Stats:
    """Counters the writer updates once per batch (never per message from the network)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.received = 0
        self.rejected = 0
        self.redeliveries = 0
        self.batches = 0
        self.rows = 0
        self.duplicates = 0
        self.failures = 0
        self.unparked = 0
        self.rejected_dropped = 0
        self.statuses_truncated = 0
        self.devices_pruned = 0
        self.receive_lag: deque[float] = deque(maxlen=_LAG_SAMPLES)
        self.device_lag: deque[float] = deque(maxlen=_LAG_SAMPLES)
        self.commits: deque[tuple[float, int]] = deque()

    def batch(self, deliveries: Sequence[Delivery], result: WriteResult | _Nothing,
              now: float, refused: int) -> None:
        rows = result.results + result.events + result.statuses
        with self.lock:
            self.batches += 1
            self.rows += rows
            self.duplicates += result.duplicates
            self.rejected += refused
            self.rejected_dropped += result.rejected_dropped
            self.statuses_truncated += result.statuses_truncated
            for d in deliveries:
                if d.redelivered:
                    self.redeliveries += 1
                record = d.record
                if record is None:
                    self.rejected += 1
                else:
                    self.receive_lag.append(now - record.received)
                    self.device_lag.append(now - record.ts)
            self.commits.append((now, rows))
            while self.commits and self.commits[0][0] < now - _RATE_WINDOW_S:
                self.commits.popleft()

    def rate(self, now: float) -> float:
        recent = [rows for t, rows in self.commits if t >= now - _RATE_WINDOW_S]
        return sum(recent) / _RATE_WINDOW_S


def quantile(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0-1, nearest rank) of ``samples``; 0.0 when there are none."""
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _sum(a: WriteResult, b: WriteResult) -> WriteResult:
    return type(a)(a.results + b.results, a.events + b.events, a.statuses + b.statuses,
                   a.duplicates + b.duplicates, a.rejected + b.rejected,
                   a.rejected_dropped + b.rejected_dropped,
                   a.statuses_truncated + b.statuses_truncated)


class Collector:
    """Moves a source's messages into the database, exactly once by key.

    Args:
        config: ``collect.yaml``; its ``batch`` section sizes the queue and the batches.
        source: Where messages come from.
        db: Where rows go (`Database`; connected by `run` if it is not).
    """

    def __init__(self, config: CollectConfig, source: Source, db: Database) -> None:
        self.config = config
        self.source = source
        self.db = db
        self._queue = Lanes(config.batch.queue, config.batch.queue_bytes)
        self._stopping = threading.Event()
        self._started = threading.Event()
        self._stats = _Stats()
        self._last_maintain = 0.0
        self.maintenance: dict[str, Any] = {}

    def deliver(self, delivery: Delivery) -> None:
        """Take one message from the source (its network thread); blocks while the queue is
        full. After `stop` messages are dropped unacknowledged: the broker sends them again."""
        size = delivery_size(delivery)
        while not self._stopping.is_set():
            if self._queue.put(delivery, size, timeout=0.5):
                with self._stats.lock:
                    self._stats.received += 1
                return

    def run(self) -> None:
        """Connect, start the source, and write batches until `stop`; the batch in hand when
        stopped is written and acknowledged first (unless the database is down then).

        Raises:
            StorageError: never for a database that fails after the start (the writer retries);
                only when `stop` comes before the first connection succeeded is it swallowed.
            SourceError: the source's receiving thread died (`Source.failure`).
        """
        if not self._connect():
            return
        self._maintain(time.time())
        self.source.start(self.deliver)
        self._started.set()
        try:
            while not self._stopping.is_set():
                batch = self._gather()
                if batch:
                    self._commit_held(batch)
                self._maintain(time.time())
                why = self.source.failure()
                if why is not None:
                    raise SourceError(f"the source stopped receiving: {why}")
        except Exception as exc:
            logger.error("collector stopped: %s: %s", type(exc).__name__, exc)
            raise
        finally:
            self.source.stop()
            self.db.close()

    def wait_started(self, timeout: float | None = None) -> bool:
        """Whether the source was started (the database reached) within ``timeout`` s."""
        return self._started.wait(timeout)

    @property
    def stopping(self) -> bool:
        """Whether `stop` was called."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Ask `run` to return after the batch in hand; safe from a signal handler."""
        self._stopping.set()

    def stats(self) -> dict[str, Any]:
        """Counters and lag: received, rows (and rows/s over the last 10 s), batches,
        duplicates, rejected (and past the caps of ``rejected``), statuses stored summarised,
        devices pruned, redeliveries, database failures, queue depth, and the p50/p99
        lag in seconds from receive to commit and from the device's time to commit."""
        s = self._stats
        now = time.time()
        with s.lock:
            receive_lag, device_lag = list(s.receive_lag), list(s.device_lag)
            out: dict[str, Any] = {
                "received": s.received, "rows": s.rows, "rows_per_s": s.rate(now),
                "batches": s.batches, "duplicates": s.duplicates, "rejected": s.rejected,
                "redeliveries": s.redeliveries, "db_failures": s.failures,
                "unparked": s.unparked,
                "rejected_dropped": s.rejected_dropped,
                "statuses_truncated": s.statuses_truncated, "devices_pruned": s.devices_pruned,
            }
        genuine, junk = self._queue.depth()
        out["queue_depth"] = genuine + junk
        out["queue_rejected"] = junk
        out["queue_bytes"] = self._queue.held
        out["lag_s"] = {"receive": {"p50": quantile(receive_lag, 0.5),
                                    "p99": quantile(receive_lag, 0.99)},
                        "device": {"p50": quantile(device_lag, 0.5),
                                   "p99": quantile(device_lag, 0.99)}}
        out["source"] = self.source.stats()
        return out

    def _connect(self) -> bool:
        delay = _BACKOFF_FIRST_S
        while not self._stopping.is_set():
            try:
                self.db.connect()
                return True
            except StorageError as exc:
                logger.warning("database unreachable (%s); trying again in %.1f s", exc, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
        return False

    def _gather(self) -> list[tuple[Delivery, int]]:
        """Messages for one batch (with their sizes), of one lane: device messages, up to
        ``max_rows`` and waiting at most ``max_age_s`` after the first, but no longer once
        rejected ones wait; or, when no device message is queued, up to `_REJECTED_BATCH`
        rejected ones queued now. Returns early (possibly empty) when stopping."""
        limit, max_age = self.config.batch.max_rows, self.config.batch.max_age_s
        first = self._queue.get(timeout=0.2)
        if first is None:
            return []
        if first[0].record is None:
            return [first, *self._queue.take_rejected(min(limit, _REJECTED_BATCH) - 1,
                                                      _REJECTED_BATCH_BYTES - first[1])]
        batch = [first]
        deadline = time.monotonic() + max_age
        while len(batch) < limit:
            left = deadline - time.monotonic()
            item = self._queue.get(timeout=max(0.0, min(left, 0.05)), only_devices=True)
            if item is not None:
                batch.append(item)
            elif left <= 0 or self._stopping.is_set() or self._queue.depth()[1]:
                break
        return batch

    def _commit_held(self, held: list[tuple[Delivery, int]]) -> None:
        try:
            self._commit([d for d, _ in held])
        finally:
            self._queue.release(sum(size for _, size in held))

    def _commit(self, batch: list[Delivery]) -> None:
        records: list[Record] = [d.record for d in batch if d.record is not None]
        parked = [d.rejection for d in batch if d.record is None and d.rejection is not None]
        result: WriteResult | _Nothing = _Nothing()  # nothing to write
        refused: list[Rejection] = []
        if records or parked:
            written = self._isolate(records, parked, refused)
            if written is None:
                # Not acknowledged: the broker hands these to the next collector run.
                logger.warning("stopping with %d messages unwritten; the broker keeps them",
                               len(batch))
                return
            result = written
        self.source.ack([d.token for d in batch])
        self._stats.batch(batch, result, time.time(), len(refused))

    def _isolate(self, records: list[Record], parked: Sequence[Rejection],
                 refused: list[Rejection]) -> WriteResult | None:
        """Write ``records`` and park ``parked``; when the database refuses the data, split
        the records in halves until the refused ones are found, and park those (appended to
        ``refused``). ``None``: stopped while the database was failing."""
        try:
            return self._retrying(records, parked)
        except StorageDataError as exc:
            if not records:
                return self._unparkable(parked, exc, refused)
            if len(records) > 1:
                half = len(records) // 2
                first = self._isolate(records[:half], parked, refused)
                if first is None:
                    return None
                second = self._isolate(records[half:], (), refused)
                return _sum(first, second) if second is not None else None
            record = records[0]
            logger.warning("message on %s refused by the database, parked in rejected: %s",
                           record.topic, exc)
            bad = rejection(record.topic, record.payload.encode("utf-8", "replace"), exc,
                            record.received, record.device)
            refused.append(bad)
            return self._isolate([], [*parked, bad], refused)

    def _unparkable(self, parked: Sequence[Rejection], exc: StorageDataError,
                    refused: list[Rejection]) -> WriteResult | None:
        """Rejected messages whose parking fails while the database answers: split down to
        the one that fails; that one is acknowledged unparked (a crash loop replaying it would
        stall the fleet), logged and counted (``unparked``)."""
        if len(parked) > 1:
            half = len(parked) // 2
            first = self._isolate([], parked[:half], refused)
            if first is None:
                return None
            second = self._isolate([], parked[half:], refused)
            return _sum(first, second) if second is not None else None
        for bad in parked:
            logger.error("rejected message on %s (%d bytes) cannot be parked, acknowledged "
                         "and counted only: %s", bad.topic, bad.size, exc)
        with self._stats.lock:
            self._stats.unparked += len(parked)
        return WriteResult(0, 0, 0, 0)

    def _retrying(self, records: list[Record], parked: Sequence[Rejection]) -> WriteResult | None:
        """One write, tried again with backoff while the database (not the data) fails;
        ``None`` when stopped meanwhile (after one last try)."""
        delay = _BACKOFF_FIRST_S
        answered = 0  # failures after which the database answered a probe
        while True:
            try:
                return self.db.write(records, parked)
            except StorageDataError:
                raise
            except StorageError as exc:
                with self._stats.lock:
                    self._stats.failures += 1
                if self._stopping.is_set():
                    logger.warning("database write failed while stopping (%s)", exc)
                    return None
                if self._answers():
                    # The database is up: what failed follows the batch (a statement over a
                    # server limit, a row that makes the server drop the connection).
                    answered += 1
                    if answered >= _BATCH_FAULT_TRIES:
                        raise StorageDataError(
                            f"the database answers, yet writing these {len(records)} rows "
                            f"failed {answered} times: {exc}") from exc
                    logger.warning("database write of %d rows failed (%s), the database "
                                   "answers: trying once more", len(records) + len(parked), exc)
                    continue
                logger.warning("database write of %d rows failed (%s); retrying in %.1f s",
                               len(records) + len(parked), exc, delay)
                self._stopping.wait(delay)
                # stopping: one last try for the batch in hand
                delay = min(delay * 2, _BACKOFF_MAX_S)

    def _answers(self) -> bool:
        try:
            self.db.probe()
        except StorageError:
            return False
        return True

    def _maintain(self, now: float) -> None:
        if now - self._last_maintain < _MAINTAIN_EVERY_S:
            return
        try:
            self.maintenance = self.db.maintain(now)
            with self._stats.lock:
                self._stats.devices_pruned += self.maintenance.get("devices_pruned", 0)
            self._last_maintain = now
        except StorageError as exc:
            logger.warning("database maintenance failed (%s); trying again later", exc)
            self._last_maintain = now - _MAINTAIN_EVERY_S + 60.0
