"""The transfer loop of one push (`edgeinfer.ota.push.Pusher`): the offer on every channel (a
device's topics or a group's), the chunks with flow control (few unacknowledged at the broker),
resends of what the devices report missing, and the statuses that answer this offer.

Everything runs in the pusher's thread; MQTT callbacks only queue events on the pusher's queue:
``("ack",)``, ``("connect",)`` and ``("status", device, status, retained, arrived)``.
"""

from __future__ import annotations

import functools
import logging
import queue
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .protocol import OtaStatus, base_topic, chunk_topic, expand_ranges, offer_topic

if TYPE_CHECKING:
    from ..mqtt.client import MqttClient

__all__ = ["PAST_RECEIVING", "Channel", "PushOffer", "Transfer", "device_channel"]

logger = logging.getLogger("edgeinfer.ota.push")  # the pusher's name, which log filters use

ProgressFn = Callable[[int, int], None]
StatusFn = Callable[[OtaStatus], None]
WatchFn = Callable[[Iterable[str], bool], None]  # subscribe to these devices' statuses (True: all)

PAST_RECEIVING = frozenset({"verifying", "applied", "committed", "rejected", "rolled_back"})
MAX_UNACKED = 8  # chunks handed to paho and not yet acknowledged by the broker
RESEND_AFTER_S = 2.0  # a chunk is not sent again sooner (the device reports a stall after 2 s)
STUCK_ACKS_S = 15.0  # no PUBACK for this long while connected: count the unacked chunks as lost


@dataclass(eq=False)
class Channel:
    """One base topic the offer and chunks go to, and the devices listening there; the offer
    (signed for this target) and its request id, which every status answering it carries."""

    base: str
    devices: frozenset[str]
    group: bool = False
    payload: bytes = b""
    request: str = ""
    pending: deque[int] = field(default_factory=deque)
    queued: set[int] = field(default_factory=set)
    sent_at: dict[int, float] = field(default_factory=dict)

    def add(self, indices: Iterable[int], *, now: float, dedupe: bool, skip_sent: bool) -> int:
        """Queue the chunks of ``indices`` not queued already: with ``skip_sent`` none sent
        before, with ``dedupe`` none sent in the last ``RESEND_AFTER_S``. Returns how many."""
        added = 0
        for i in indices:
            if i in self.queued:
                continue
            sent = self.sent_at.get(i)
            if sent is not None and (skip_sent or (dedupe and now - sent < RESEND_AFTER_S)):
                continue
            self.pending.append(i)
            self.queued.add(i)
            added += 1
        return added


@dataclass(frozen=True)
class PushOffer:
    """What every channel of one push sends: the file and the manifest's identity of it;
    ``sign`` gives a channel the offer signed for its own target."""

    sign: Callable[[Channel], Channel]  # the channel with its own signed offer
    transfer: str
    sha256: str
    size: int
    chunk_size: int
    chunks: int
    pipeline: str
    path: Path
    name: str
    version: str


def device_channel(prefix: str, *, device: str) -> Channel:
    """The channel of one device: its own topics."""
    return Channel(base_topic(prefix, device=device), frozenset({device}))


class Transfer:
    """The transfer loop of one push: offers, chunks with flow control, resends, statuses.

    Everything runs in the calling thread; MQTT callbacks only queue events.
    """

    def __init__(self, client: MqttClient, offer: PushOffer, file: IO[bytes], deadline: float,
                 events: queue.Queue[tuple[Any, ...]], watch: WatchFn,
                 on_progress: ProgressFn | None, on_status: StatusFn | None) -> None:
        self.client = client
        self.offer = offer
        self.file = file
        self.deadline = deadline
        self.events = events
        self.watch = watch
        self.on_progress = on_progress
        self.on_status = on_status
        self.timed_out: set[str] = set()  # targets of any transfer that ran out of time
        self.subscribed: set[str] = set()
        self.wildcard = False
        self.unacked = 0
        self.last_ack = time.monotonic()
        self.reported = -1
        self.by_device: dict[str, Channel] = {}

    def transfer(self, channels: list[Channel], *, wait: bool) -> dict[str, OtaStatus]:
        """Offer on every channel and run until every device is done or the deadline."""
        targets = {d for ch in channels for d in ch.devices}
        self._subscribe(channels)
        statuses: dict[str, OtaStatus] = {}
        seen: set[str] = set()  # devices whose first answer to the offer arrived
        resync: set[str] = set()  # devices not heard from since the broker came back
        by_device = {d: ch for ch in channels for d in ch.devices}
        self.by_device.update(by_device)
        self._offer(channels)
        self.reported = -1
        want = (lambda s: s.final) if wait else (lambda s: s.state in PAST_RECEIVING)
        while not (len(statuses) == len(targets) and all(want(s) for s in statuses.values())):
            now = time.monotonic()
            if now >= self.deadline:
                break
            self._check_acks()
            self._pump(channels, statuses)
            try:
                event = self.events.get(timeout=min(0.2, self.deadline - now))
            except queue.Empty:
                continue
            kind = event[0]
            if kind == "ack":
                self.unacked = max(0, self.unacked - 1)
                self.last_ack = time.monotonic()
            elif kind == "connect":
                logger.info("reconnected to the MQTT broker; offering %s again",
                            self.offer.transfer)
                self._offer(channels)
                resync = set(targets)
                self.last_ack = time.monotonic()
            elif kind == "status":
                device, status = event[1], event[2]
                if device not in targets or not self._ours(status, by_device[device]):
                    continue
                previous = statuses.get(device)
                if previous is not None and previous.final:
                    continue  # its outcome is known; a late echo does not change it
                statuses[device] = status
                if self.on_status is not None:
                    self.on_status(status)
                if status.state == "receiving":
                    self._missing(by_device[device], status, first=device not in seen,
                                  resync=device in resync, previous=previous)
                    seen.add(device)
                resync.discard(device)
                self._progress(statuses, targets)
        return self._finish(targets, statuses, wait)

    # -- steps --------------------------------------------------------------------------------
    def _subscribe(self, channels: list[Channel]) -> None:
        if any(ch.group for ch in channels) and not self.wildcard:
            self.wildcard = True
            self.watch((), True)
        elif not self.wildcard:
            new = {d for ch in channels for d in ch.devices} - self.subscribed
            self.subscribed |= new
            self.watch(sorted(new), False)

    def _offer(self, channels: list[Channel]) -> float:
        """Publish the offer on every channel; returns when it began (answers come after)."""
        began = time.monotonic()
        for ch in channels:
            if not self.client.publish(offer_topic(ch.base), ch.payload, qos=1):
                logger.debug("offer on %s waits for the broker", ch.base)  # see "connect"
        return began

    @staticmethod
    def _ours(status: OtaStatus, channel: Channel) -> bool:
        """Is this status an answer to this push's offer on the device's channel? Only a
        status carrying the offer's request id is: a retained status of an earlier push, or
        the refusal of someone else's (or a forged) offer, carries another id or none."""
        return status.request is not None and status.request == channel.request

    def _missing(self, ch: Channel, status: OtaStatus, *, first: bool, resync: bool,
                 previous: OtaStatus | None) -> None:
        """Queue the chunks a ``receiving`` status lists as missing.

        A device's first answer gets every chunk it lists (on a group topic: those not already
        sent to the group). After a reconnect, the next status gets what it lists at once.
        Otherwise a status counts once the first pass is out and the device reports no
        progress since its previous status (its 2-s stall report: a progress report while
        chunks are still on their way over a slow link would list those too), and gets what
        was not sent in the last 2 s.
        """
        missing = expand_ranges(status.missing, self.offer.chunks)
        now = time.monotonic()
        if first:
            ch.add(missing, now=now, dedupe=False, skip_sent=ch.group)
            return
        if not resync and (ch.pending or previous is None or previous.state != "receiving"
                           or status.received > previous.received):
            return
        added = ch.add(missing, now=now, dedupe=True, skip_sent=False)
        if added:
            logger.info("%s misses %d chunks of %s; sending them again", status.device, added,
                        self.offer.transfer)

    def _pump(self, channels: list[Channel], statuses: dict[str, OtaStatus]) -> None:
        """Publish pending chunks, round robin over channels, keeping few unacknowledged."""
        o = self.offer
        while self.unacked < MAX_UNACKED:
            busy = [ch for ch in channels if ch.pending and not all(
                d in statuses and statuses[d].state in PAST_RECEIVING for d in ch.devices)]
            if not busy:
                return
            for ch in busy:
                if self.unacked >= MAX_UNACKED:
                    return
                index = ch.pending[0]
                self.file.seek(index * o.chunk_size)
                data = self.file.read(o.chunk_size)
                if not self.client.publish(chunk_topic(ch.base, o.transfer, index), data, qos=1,
                                           on_ack=functools.partial(self.events.put, ("ack",))):
                    return  # not connected: the reconnect event resumes
                ch.pending.popleft()
                ch.queued.discard(index)
                ch.sent_at[index] = time.monotonic()
                self.unacked += 1

    def _check_acks(self) -> None:
        if (self.unacked and self.client.connected
                and time.monotonic() - self.last_ack > STUCK_ACKS_S):
            logger.debug("%d chunks unacknowledged for %.0f s; not waiting for them",
                         self.unacked, STUCK_ACKS_S)
            self.unacked = 0

    def _progress(self, statuses: dict[str, OtaStatus], targets: set[str]) -> None:
        """Report the bytes every target still receiving has confirmed (the least of them),
        from the devices' ``receiving`` statuses: what the broker took may still be queued
        for a slow device."""
        if self.on_progress is None:
            return
        o = self.offer
        confirmed = [o.size]
        for d in targets:
            s = statuses.get(d)
            if s is None:
                confirmed.append(0)
            elif s.state == "receiving":
                confirmed.append(min(o.size, s.received * o.chunk_size))
        done = min(confirmed)
        if done > self.reported:
            self.reported = done
            self.on_progress(done, o.size)

    def _finish(self, targets: set[str], statuses: dict[str, OtaStatus],
                wait: bool) -> dict[str, OtaStatus]:
        o = self.offer
        for d in sorted(targets - set(statuses)):
            statuses[d] = OtaStatus(device=d, state="receiving", transfer=o.transfer,
                                    request=self.by_device[d].request if d in self.by_device
                                    else None,
                                    pipeline=o.pipeline, name=o.name, version=o.version,
                                    sha256=o.sha256, chunks=o.chunks,
                                    message="no answer from the device")
        late = sorted(d for d, s in statuses.items()
                      if not (s.final if wait else s.state in PAST_RECEIVING))
        self.timed_out.update(late)
        return dict(sorted(statuses.items()))
