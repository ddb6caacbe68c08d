"""The publisher thread that drains the outbox to the broker, and the plumbing a daemon holds.

Results reach the broker only through the outbox (``edgeinfer.mqtt.outbox``): the MQTT sink
puts them there and wakes the ``Publisher``, which hands up to ``window`` of them to the client
and deletes each one when its PUBACK arrives. While disconnected it sleeps; on every (re)connect
whatever was in flight is taken again from the oldest, so a result is never skipped, only
possibly sent twice (``seq`` lets consumers drop the copy).

Replay policy. Order per pipeline is never broken: results leave oldest first, so a consumer
may drop anything at or below the last seq it saw. What was waiting when the connection came
back (the backlog) is paced: publishing is limited to ``replay_rate`` per second *plus one for
every result put since the reconnect*. So the backlog shrinks by ``replay_rate`` a second
whatever the live rate, the link carries at most ``replay_rate`` more than the live rate, and
live results interleave at their full rate behind the older ones instead of being starved; the
price is that during catch-up a live result arrives ``backlog / replay_rate`` seconds late.
Once the backlog is out, there is no limit but the window.
"""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from ..errors import EdgeInferError, StateError
from ..paths import outbox_path
from .outbox_migrate import adopt_legacy, set_aside_others
from .outbox import Outbox

if TYPE_CHECKING:
    from ..config.mqtt import MqttConfig
    from .client import MqttClient

__all__ = ["MqttPlumbing", "Publisher"]

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 1.0  # nothing in flight: wake anyway this often (age expiry)
_ACK_WAIT_S = 0.05  # acks pending: settle them at least this often
# The window is full: look for acks this often. Polling only under load is cheaper than a
# wake-up per PUBACK from the client's thread (and acks get deleted in bigger batches).
_FULL_WAIT_S = 0.002
# A full window with no PUBACK for this long (a broker that refuses the topic, an ack lost in a
# broker restart paho did not notice) is taken again from the oldest rather than waited on forever.
_STALL_S = 30.0
# The one outbox file of versions before one per device and broker (``paths.outbox_path``).
LEGACY_OUTBOX = "outbox.sqlite3"


class Publisher:
    """Publishes the outbox through an ``MqttClient`` in a thread of its own.

    Args:
        client: The connection; its ``publish(..., on_ack=...)`` reports PUBACKs.
        outbox: Where results wait.
        window: At most this many results handed to the client and not yet acknowledged.
        replay_rate: Backlog results per second after a (re)connect, besides live ones.
    """

    def __init__(self, client: MqttClient, outbox: Outbox, *, window: int = 256,
                 replay_rate: float = 500.0) -> None:
        self.client = client
        self.outbox = outbox
        self.window = window
        self.replay_rate = replay_rate
        self.published = 0
        self.acked = 0
        self.replayed = 0
        self.errors = 0
        self.stalls = 0
        self._progress = time.monotonic()  # last time an ack came or the window was empty
        self._acks: collections.deque[int] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        self._flush_until = 0.0
        self._thread: threading.Thread | None = None
        # Bumped by the client's thread on every connect; a client already connected counts.
        self._connects = int(client.connected)
        self._seen_connects = 0
        # Down from a disconnect until our own connect callback ran: the client says
        # `connected` a moment before its callbacks run, and results sent in that moment went
        # out again at the catch-up that callback starts (duplicates, out of order).
        self._down = not client.connected
        # catch-up after a connect: ids up to _backlog_end are the backlog
        self._backlog_end = 0
        self._catchup_t0 = 0.0
        self._catchup_puts = 0
        self._catchup_sent = 0
        client.on_connect(self._on_connect)
        client.on_disconnect(self._on_disconnect)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the thread (publishing begins once the client is connected)."""
        if self._thread is not None:
            raise StateError("the publisher was already started")
        self._thread = threading.Thread(target=self._run, name="edgeinfer-mqtt-publisher",
                                        daemon=True)
        self._thread.start()

    def stop(self, *, flush_s: float = 1.0) -> None:
        """Stop publishing. While connected, go on for up to ``flush_s`` until the outbox is
        empty and what is in flight acknowledged; what is left waits on disk for the next
        start (results in flight then are sent again). Idempotent."""
        thread = self._thread
        if thread is None or self._stopping:
            return
        self._flush_until = time.monotonic() + flush_s
        self._stopping = True
        self._wake.set()
        thread.join(flush_s + 5.0)
        if thread.is_alive():
            logger.warning("mqtt publisher did not stop within %.0f s", flush_s + 5.0)

    def wake(self) -> None:
        """A result was put: publish it as soon as the window allows."""
        self._wake.set()

    # -- client callbacks (the client's thread) -------------------------------------------------
    def _on_connect(self, *_: Any) -> None:
        self._connects += 1
        self._down = False
        self._wake.set()

    def _on_disconnect(self, *_: Any) -> None:
        self._down = True
        self._wake.set()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        last_expire = time.monotonic()
        while True:
            self._wake.clear()
            self._settle_acks()
            now = time.monotonic()
            if self._stopping and (now >= self._flush_until or not self.client.connected
                                   or not self.outbox.depth):
                return
            if now - last_expire >= _IDLE_WAIT_S:
                last_expire = now
                self._guarded(self.outbox.expire)
            wait = self._publish_some()
            if wait:
                self._wake.wait(min(wait, _ACK_WAIT_S) if self._stopping else wait)

    def _publish_some(self) -> float:
        """Publish what the window and the pacing allow; returns how long to sleep (0: go on)."""
        if self._down or not self.client.connected:
            return _IDLE_WAIT_S
        if self._connects != self._seen_connects:
            self._begin_catch_up()
        in_flight = self.outbox.in_flight
        if not in_flight:
            self._progress = time.monotonic()
        room = self.window - in_flight
        # Refill in bursts of at least a quarter window: the client's network thread then
        # sends many packets per wake-up (20-30 % more results/s than topping up by a few).
        if room <= 0 or (in_flight and room < self.window // 4):
            if time.monotonic() - self._progress > _STALL_S:
                self._stalled()
            return _FULL_WAIT_S
        allowance = self._allowance()
        if allowance <= 0:
            return min(_ACK_WAIT_S, 1.0 / self.replay_rate)
        batch = self.outbox.take(min(room, allowance))
        if not batch:
            self._backlog_end = 0
            return _ACK_WAIT_S if self._acks or self.outbox.in_flight else _IDLE_WAIT_S
        connects = self._connects
        for msg in batch:
            if connects != self._connects:
                return 0.0  # a connection that came back meanwhile replays from the oldest
            if not self._send(msg):
                # Lost the connection (or the client refused): take again from the oldest
                # unacknowledged result, so nothing after a gap goes out first.
                self.outbox.requeue()
                return _ACK_WAIT_S
        if batch[-1].id > self._backlog_end:
            self._backlog_end = 0  # the whole backlog is handed over: catch-up is done
        return 0.0

    def _send(self, msg: Any) -> bool:
        if msg.qos == 0:  # at most once: it is done when handed over
            if not self.client.publish(msg.topic, msg.payload, qos=0):
                return False
            self._acks.append(msg.id)
        # A C-level partial: the PUBACK path in the client's thread runs no Python frame of ours.
        elif not self.client.publish(msg.topic, msg.payload, qos=msg.qos,
                                     on_ack=partial(self._acks.append, msg.id)):
            return False
        self.published += 1
        if msg.id <= self._backlog_end:
            self.replayed += 1
        self._catchup_sent += 1
        return True

    def _stalled(self) -> None:
        self.stalls += 1
        self._progress = time.monotonic()
        if self.stalls == 1 or logger.isEnabledFor(logging.DEBUG):
            logger.warning("mqtt: no PUBACK for %.0f s with %d results in flight; sending them "
                           "again (does the broker refuse the result topics?)", _STALL_S,
                           self.outbox.in_flight)
        self.outbox.requeue()

    def _begin_catch_up(self) -> None:
        self._seen_connects = self._connects
        self.outbox.requeue()  # whatever was in flight goes again, oldest first
        self._backlog_end = self.outbox.max_id
        self._catchup_t0 = time.monotonic()
        self._catchup_puts = self.outbox.puts
        self._catchup_sent = 0

    def _allowance(self) -> int:
        if not self._backlog_end:
            return self.window
        earned = (self.replay_rate * (time.monotonic() - self._catchup_t0)
                  + (self.outbox.puts - self._catchup_puts) + self.window)
        return int(earned) - self._catchup_sent

    def _settle_acks(self) -> None:
        if not self._acks:
            return
        ids = []
        while self._acks:
            ids.append(self._acks.popleft())
        self.acked += len(ids)
        self._progress = time.monotonic()
        self._guarded(self.outbox.ack_many, ids)

    def _guarded(self, fn: Any, *args: Any) -> None:
        # A failed delete (a full disk) only means a duplicate later; never stop publishing.
        try:
            fn(*args)
        except sqlite3.Error as exc:
            self.errors += 1
            if self.errors == 1 or logger.isEnabledFor(logging.DEBUG):
                logger.warning("outbox: %s", exc)

    # -- state ----------------------------------------------------------------------------------
    @property
    def catching_up(self) -> bool:
        """A backlog from before the last (re)connect is still being replayed."""
        return bool(self._backlog_end)

    def stats(self) -> dict[str, Any]:
        """``published``, ``acked``, ``in_flight``, ``replayed``, ``catching_up``, ``errors``,
        ``stalls`` and the outbox's ``depth``, ``bytes``, ``oldest_age_s``, ``dropped``..."""
        data = self.outbox.stats()
        data.update(published=self.published, acked=self.acked, replayed=self.replayed,
                    catching_up=self.catching_up, errors=self.errors, stalls=self.stalls)
        return data


class MqttPlumbing:
    """What a daemon holds for MQTT: one client, one outbox, one publisher.

    Args:
        config: The ``mqtt:`` section.
        device_id: This device's topic level.
        state_dir: Where the outbox lives unless ``config.outbox.path`` says otherwise: one file
            per device and broker (``edgeinfer.paths.outbox_path``), recording both, so results
            meant for one broker are never published to another.
        birth: The client's retained birth message (see ``MqttClient``).
        client: An already built client (tests); default one made from ``config``.
        window: Results in flight at most.

    ``mqtt=plumbing`` in the context of sinks makes ``type: mqtt`` sinks publish through it.
    """

    def __init__(self, config: MqttConfig, device_id: str, state_dir: str | Path, *,
                 birth: Any = None, client: MqttClient | None = None, window: int = 256) -> None:
        self.broker = f"{config.host}:{config.resolved_port()}"
        path = (Path(config.outbox.path) if config.outbox.path else
                outbox_path(Path(state_dir), device_id, config.host, config.resolved_port()))
        self.config = config
        self.outbox = Outbox(path, config.outbox, owner=f"{device_id}@{self.broker}")
        try:  # the outbox is locked while open: never leave it open behind a failure
            legacy = Path(state_dir) / LEGACY_OUTBOX
            if not config.outbox.path and legacy.is_file():
                self._adopt(legacy, f"{config.prefix}/{device_id}/")
            others = set_aside_others(self.outbox, device_id)
            if others is not None:
                logger.warning("outbox %s held %d results of other devices; moved them to %s, "
                               "never to be published here", path, others[1], others[0])
            if client is None:
                from .client import MqttClient

                client = MqttClient(config, device_id, birth=birth)
        except BaseException:
            self.outbox.close()
            raise
        self.client = client
        self.topics = client.topics
        self.publisher = Publisher(client, self.outbox, window=window,
                                   replay_rate=config.outbox.replay_rate)
        self._started = False
        self._ended: tuple[bool, str] | None = None  # (connected, last error) at stop

    def _adopt(self, legacy: Path, topics: str) -> None:
        try:
            n = adopt_legacy(self.outbox, legacy, topics)
        except (EdgeInferError, sqlite3.Error) as exc:  # it stays there for the next start
            logger.warning("outbox: could not take this device's results from %s: %s",
                           legacy, exc)
            return
        if n:
            logger.warning("outbox: took %d results waiting in %s (the outbox of an older "
                           "version) into %s", n, legacy, self.outbox.path)

    def start(self) -> None:
        """Start publishing and connecting (a broker that is not there yet is fine: results
        wait in the outbox)."""
        self._started = True
        self.publisher.start()
        self.client.start()

    def stop(self, *, timeout_s: float = 5.0) -> None:
        """Flush: publish what waits while connected, for up to ``timeout_s``; then the
        client's ``stopped`` status, disconnect, close the outbox. What is left stays on disk
        for the next start."""
        if self._started:
            self.publisher.stop(flush_s=timeout_s)
            if self._ended is None:
                self._ended = (self.client.connected, self.client.last_error)
            self.client.stop(timeout_s=timeout_s)
        self.outbox.close()

    def last_seq(self, pipeline: str) -> int:
        """The last seq put for ``pipeline``; its results after a restart start above it."""
        return self.outbox.last_seq(pipeline)

    def put(self, pipeline: str, seq: int, payload: bytes, qos: int = 1) -> None:
        """Queue one result of ``pipeline`` for ``<prefix>/<dev>/<pipeline>/result``."""
        self.outbox.put(pipeline, seq, self.topics.result(pipeline), payload, qos)
        self.publisher.wake()

    def stats(self) -> dict[str, Any]:
        """The publisher's and outbox's stats, and the connection's (``protocol``: the MQTT
        version in use, ``v5`` or ``v3.1.1``)."""
        data = self.publisher.stats()
        data.update(connected=self.client.connected, reconnects=self.client.reconnects,
                    broker=self.broker, protocol=self.client.protocol)
        return data

    def summary(self) -> dict[str, Any]:
        """Where results wait and why: ``waiting`` (results in the outbox), ``path``,
        ``broker``, ``connected`` and ``error`` (as they were when ``stop`` began, or now),
        ``recovered`` (a damaged outbox found at start, else ``None``). Valid after ``stop``."""
        connected, error = self._ended or (self.client.connected, self.client.last_error)
        recovered = self.outbox.recovered
        return {"waiting": self.outbox.depth, "path": str(self.outbox.path),
                "broker": self.broker, "connected": connected, "error": error,
                "recovered": recovered.to_dict() if recovered else None}

    def birth_info(self) -> dict[str, Any]:
        """What the retained status says about the outbox: its ``path`` and ``recovered`` (how a
        damaged file found at start was handled: ``moved_to``, ``reason``, ``salvaged``,
        ``unreadable``, ``at``; ``None`` normally)."""
        recovered = self.outbox.recovered
        return {"path": str(self.outbox.path),
                "recovered": recovered.to_dict() if recovered else None}

    def describe(self) -> str:
        """One line for logs and ``STATUS=``: ``outbox 90 waiting in PATH (broker H:P
        unreachable: connection refused)``, or ``outbox 0`` when nothing waits and connected."""
        s = self.summary()
        if not s["waiting"] and s["connected"]:
            return "outbox 0"
        text = f"outbox {s['waiting']} waiting in {s['path']}"
        if not s["connected"]:
            text += f" (broker {s['broker']} unreachable" + \
                (f": {s['error']})" if s["error"] else ")")
        return text

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
