"""The push side of an over-the-air model update (``docs/ota.md``): offer a signed manifest to
devices or a fleet group, send the chunks each device reports missing, and collect the
devices' statuses until they reach a final state.

    pusher = Pusher(client, config.prefix)          # client: a started MqttClient
    statuses = pusher.push("face-v2.tflite", devices=["pi-kitchen"], group=None,
                           pipeline="faces", version="2.0.0", key=load_private_key("ota-key"))

The pusher prints nothing: progress and statuses go to the ``on_progress`` and ``on_status``
callbacks, which run in the calling thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import ConfigError, OtaError, OtaRejected
from .manifest import Golden, Target, build_manifest, make_offer, transfer_id
from .protocol import MAX_CHUNK, MIN_CHUNK, OtaStatus, base_topic, rollback_topic, status_topic
from .rollback import make_rollback
from .sender import (
    PAST_RECEIVING,
    Channel,
    ProgressFn,
    PushOffer,
    StatusFn,
    Transfer,
    device_channel,
)
from .signature import request_id

if TYPE_CHECKING:
    from ..keys import PrivateKey
    from ..mqtt.client import Message, MqttClient

__all__ = ["PAST_RECEIVING", "Pusher"]

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 30.0


class Pusher:
    """Pushes model updates and rollback requests over one MQTT connection.

    Args:
        client: A started `edgeinfer.mqtt.client.MqttClient` (``announce=False``); it
            reconnects by itself, and the pusher re-offers after every reconnect.
        prefix: The devices' first topic level (``mqtt.prefix``).
        discover_s: How long a group's retained birth messages are collected.

    Attributes:
        members: The group members found by the last push or rollback (empty for devices).
        skipped: Members the last push did not reach because its canary failed.
        timed_out: Targets of the last push or rollback without a final (or, without ``wait``,
            a post-``receiving``) status when the time ran out.
    """

    def __init__(self, client: MqttClient, prefix: str, *, discover_s: float = 1.5) -> None:
        self.client = client
        self.prefix = prefix
        self.discover_s = discover_s
        self.members: list[str] = []
        self.skipped: list[str] = []
        self.timed_out: list[str] = []
        self._events: queue.Queue[tuple[Any, ...]] | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        client.on_connect(self._reconnected)

    # -- public -------------------------------------------------------------------------------
    def push(self, model_path: str | Path, *, devices: list[str] | None, group: str | None,
             pipeline: str, version: str, key: PrivateKey | None, name: str | None = None,
             task: str | None = None, golden_path: str | Path | None = None,
             tolerance: float = 1e-3, chunk_size: int = 262144, canary: int = 0,
             wait: bool = True, timeout_s: float = 300.0, on_progress: ProgressFn | None = None,
             on_status: StatusFn | None = None, sequence: int | None = None,
             downgrade: bool = False, ttl_s: float = 3600.0) -> dict[str, OtaStatus]:
        """Offer ``model_path`` and send it until every target is done.

        Args:
            model_path: The ONNX or TFLite file.
            devices: Target device ids (each by its own topics), or ``None`` with ``group``.
            group: A fleet group (one offer and one set of chunks on the group's topics).
            pipeline: The devices' pipeline whose model is replaced.
            version: The manifest's version string.
            key: The signing key; ``None`` sends an unsigned offer (only devices with
                ``ota.allow_unsigned`` take it).
            name: Model name (default: the file's stem).
            task: The task the model is for; devices refuse it for a pipeline of another task.
            golden_path: A golden ``.npz`` the devices check the model's outputs against.
            tolerance: ``atol`` and ``rtol`` for the golden outputs.
            chunk_size: Bytes per chunk, 64-512 KiB.
            canary: With ``group``: push to this many members first (the first by id) and go
                on to the group only when all of them committed.
            wait: Wait for final states (``rejected``, ``committed``, ``rolled_back``); else
                return once every target has received the whole file.
            timeout_s: Give up waiting after this long (the whole push, canary included).
            on_progress: ``(bytes, total)``: the bytes every target confirmed (the least of
                them, from the devices' ``receiving`` statuses); called when it grows, and
                from 0 again for the group after a canary.
            on_status: Every status of this transfer from a target, as it arrives.
            sequence: The pipeline's update sequence (default: the time in milliseconds); a
                device refuses one not above the highest it installed ...
            downgrade: ... unless the manifest is signed as a deliberate downgrade.
            ttl_s: The manifest expires this long after it is signed.

        Returns:
            The last status of every target, by device id. A target that never answered gets a
            ``receiving`` status with ``message`` saying so; see `timed_out`.

        Raises:
            ConfigError: Bad options (no version, a chunk size out of range, a canary without a
                group or not smaller than the group, an unreadable golden file).
            ModelNotFoundError: No model file.
            OtaError: The broker cannot be reached, or the group has no online member.
        """
        self._check_targets(devices, group, canary)
        if not version:
            raise ConfigError("--version is required: the manifest needs a version string")
        if not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
            raise ConfigError(f"chunk size {chunk_size} bytes is outside {MIN_CHUNK // 1024}-"
                              f"{MAX_CHUNK // 1024} KiB")
        if not tolerance > 0:
            raise ConfigError(f"--tolerance {tolerance}: must be > 0")
        if not 0 < ttl_s <= 30 * 86400:
            raise ConfigError(f"--ttl {ttl_s:g}: must be > 0 and at most 30 days")
        if sequence is not None and not 0 <= sequence < 2**63:
            raise ConfigError(f"--sequence {sequence}: must be 0 <= n < 2**63")
        golden_bytes = _read_golden(golden_path) if golden_path is not None else None
        golden = None if golden_bytes is None else Golden(
            sha256=hashlib.sha256(golden_bytes).hexdigest(), size=len(golden_bytes),
            atol=tolerance, rtol=tolerance)
        try:
            manifest = build_manifest(model_path, pipeline=pipeline, version=version, name=name,
                                      task=task, golden=golden, chunk_size=chunk_size,
                                      target=Target(group=group) if group else
                                      Target(device=(devices or ["-"])[0]),
                                      sequence=sequence, downgrade=downgrade, ttl_s=ttl_s,
                                      key_id=key.key_id if key is not None else None)
            make_offer(manifest, key, golden_bytes)  # its size, before anything connects
        except OtaRejected as exc:  # a field the manifest's rules refuse: an option's fault
            raise ConfigError(str(exc)) from exc
        except ValueError as exc:  # an offer over MAX_OFFER_BYTES (a large golden file)
            raise ConfigError(str(exc)) from exc

        def sign(ch: Channel) -> Channel:
            """The channel with the offer signed for its target (device or group)."""
            name_ = next(iter(ch.devices)) if not ch.group else ch.base.rsplit("/", 1)[1]
            target = Target(group=name_) if ch.group else Target(device=name_)
            payload = make_offer(msgspec.structs.replace(manifest, target=target), key,
                                 golden_bytes)
            offer = msgspec.json.decode(payload)
            ch.payload, ch.request = payload, request_id(offer["manifest"], offer["signature"])
            return ch

        offer = PushOffer(sign, transfer_id(manifest.sha256), manifest.sha256, manifest.size,
                          chunk_size, len(manifest.chunks), pipeline, Path(model_path),
                          manifest.name, manifest.version)
        self.members, self.skipped, self.timed_out = [], [], []
        deadline = time.monotonic() + timeout_s
        self._connect(deadline)
        if group is not None:
            self.members = self._discover(group)
            if canary >= len(self.members):
                raise ConfigError(f"--canary {canary} needs a group of more than {canary} online "
                                  f"devices; {group} has {len(self.members)}")
        with self._session() as events, offer.path.open("rb") as file:
            run = Transfer(self.client, offer, file, deadline, events,
                           lambda devices, wildcard: self._watch_statuses(devices, wildcard, events),
                           on_progress, on_status)
            try:
                return self._transfers(run, offer, devices, group, canary, wait)
            finally:
                self.timed_out = sorted(run.timed_out)

    def rollback(self, *, devices: list[str] | None, group: str | None, pipeline: str,
                 key: PrivateKey | None, wait: bool = True, timeout_s: float = 300.0,
                 on_status: StatusFn | None = None) -> dict[str, OtaStatus]:
        """Ask the targets to go back to their previous model for ``pipeline``.

        Returns:
            With ``wait``: each target's ``rolled_back`` or ``rejected`` status (a target that
            did not answer in time is in `timed_out`, with its last status if it had one).
            Without: ``{}`` once the broker took the request.

        Raises:
            ConfigError: Bad targets.
            OtaError: The broker cannot be reached, or the group has no online member.
        """
        self._check_targets(devices, group, 0)
        self.members, self.skipped, self.timed_out = [], [], []
        deadline = time.monotonic() + timeout_s
        self._connect(deadline)
        targets = list(devices or [])
        if group is not None:
            self.members = targets = self._discover(group)
        sends: list[tuple[str, bytes]] = []  # (base, request signed for that target)
        requests: dict[str, str] = {}  # device -> the id of the request it answers
        try:
            for t in ([Target(group=group)] if group is not None
                      else [Target(device=d) for d in targets]):
                payload = make_rollback(pipeline, key, target=t)
                env = msgspec.json.decode(payload)
                rid = request_id(env["request"], env["signature"])
                for d in (targets if t.group is not None else [t.device or ""]):
                    requests[d] = rid
                sends.append((base_topic(self.prefix, device=t.device, group=t.group), payload))
        except ValueError as exc:
            raise ConfigError(f"--pipeline: {exc}") from exc
        with self._session() as events:
            self._watch_statuses(targets, group is not None, events)
            acked = threading.Semaphore(0)
            for base, payload in sends:
                while not self.client.publish(rollback_topic(base), payload, qos=1,
                                              on_ack=acked.release):
                    if time.monotonic() > deadline:
                        raise OtaError("lost the MQTT broker before the rollback request went out")
                    time.sleep(0.1)
            if not wait:
                for _ in sends:
                    acked.acquire(timeout=max(0.1, min(10.0, deadline - time.monotonic())))
                return {}
            return self._collect_rollback(requests, deadline, events, on_status)

    # -- helpers ------------------------------------------------------------------------------
    def _transfers(self, run: Transfer, offer: PushOffer, devices: list[str] | None,
                   group: str | None, canary: int, wait: bool) -> dict[str, OtaStatus]:
        """Devices: one transfer, each on its own topics. A group: its first ``canary``
        members on their own topics, then (once all of them committed) the rest on the
        group's topics."""
        if group is None:
            assert devices is not None
            return run.transfer([offer.sign(device_channel(self.prefix, device=d))
                                 for d in dict.fromkeys(devices)], wait=wait)
        statuses: dict[str, OtaStatus] = {}
        rest = self.members
        if canary:
            statuses = run.transfer([offer.sign(device_channel(self.prefix, device=d))
                                     for d in self.members[:canary]], wait=True)
            if any(s.state != "committed" for s in statuses.values()):
                self.skipped = self.members[canary:]
                return statuses
            rest = self.members[canary:]
        base = base_topic(self.prefix, group=group)
        statuses.update(run.transfer([offer.sign(Channel(base, frozenset(rest), group=True))],
                                     wait=wait))
        return statuses

    @staticmethod
    def _check_targets(devices: list[str] | None, group: str | None, canary: int) -> None:
        if (not devices) == (group is None):
            raise ConfigError("name the target: one or more --device, or --group")
        if canary < 0:
            raise ConfigError(f"--canary {canary}: must be >= 0")
        if canary and group is None:
            raise ConfigError("--canary needs --group (it picks devices of the group)")
        try:
            for d in devices or ():
                base_topic("x", device=d)
            if group is not None:
                base_topic("x", group=group)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def _connect(self, deadline: float) -> None:
        wait_s = max(0.0, min(CONNECT_TIMEOUT_S, deadline - time.monotonic()))
        if not self.client.wait_connected(wait_s):
            why = self.client.last_error or self.client.state
            raise OtaError(f"cannot reach the MQTT broker {self.client.config.host}:"
                           f"{self.client.config.resolved_port()} ({why})")

    def _discover(self, group: str) -> list[str]:
        """Online devices whose retained birth message lists ``group``."""
        births: dict[str, Any] = {}
        lock = threading.Lock()
        cut = len(self.prefix) + 1

        def on_birth(msg: Message) -> None:
            try:
                data = json.loads(msg.payload)
            except (ValueError, RecursionError):  # any bytes a client sent
                return
            with lock:
                births[msg.topic[cut:].split("/", 1)[0]] = data

        unsubscribe = self.client.subscribe(f"{self.prefix}/+/status", 1, on_birth)
        try:
            time.sleep(self.discover_s)
        finally:
            unsubscribe()
        with lock:
            members = sorted(d for d, b in births.items() if isinstance(b, dict)
                             and b.get("state") == "online"
                             and group in (b.get("groups") or ()))
        if not members:
            raise OtaError(f"no online device announces group {group}")
        logger.info("group %s: %d online members: %s", group, len(members), ", ".join(members))
        return members

    def _session(self) -> _Session:
        return _Session(self)

    def _reconnected(self) -> None:
        events = self._events
        if events is not None:
            events.put(("connect",))

    def _watch_statuses(self, devices: Iterable[str], wildcard: bool,
                        events: queue.Queue[tuple[Any, ...]]) -> None:
        """Subscribe to the targets' status topics; the subscriptions end with the session."""
        cut = len(self.prefix) + 1

        def on_status(msg: Message) -> None:
            try:
                status = OtaStatus.decode(msg.payload)
            except (msgspec.ValidationError, msgspec.DecodeError):
                logger.debug("ignored a malformed OTA status on %s", msg.topic)
                return
            device = msg.topic[cut:].split("/", 1)[0]
            events.put(("status", device, status, msg.retain, time.monotonic()))

        topics = [f"{self.prefix}/+/ota/status"] if wildcard else [
            status_topic(self.prefix, d) for d in devices]
        self._unsubscribe += [self.client.subscribe(t, 1, on_status) for t in topics]

    def _collect_rollback(self, requests: dict[str, str], deadline: float,
                          events: queue.Queue[tuple[Any, ...]],
                          on_status: StatusFn | None) -> dict[str, OtaStatus]:
        """Each target's answer to its own request (statuses about anything else ignored)."""
        done: dict[str, OtaStatus] = {}
        while len(done) < len(requests):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                event = events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if event[0] != "status":
                continue
            _, device, status, _retained, _arrived = event
            if device in done or status.request is None or status.request != requests.get(device):
                continue
            if status.state in ("rolled_back", "rejected"):
                done[device] = status
                if on_status is not None:
                    on_status(status)
        self.timed_out = sorted(set(requests) - set(done))
        return done


class _Session:
    """The pusher's event queue and status subscriptions for one push or rollback."""

    def __init__(self, pusher: Pusher) -> None:
        self._pusher = pusher

    def __enter__(self) -> queue.Queue[tuple[Any, ...]]:
        events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._pusher._events = events
        return events

    def __exit__(self, *exc: object) -> None:
        unsubscribe, self._pusher._unsubscribe = self._pusher._unsubscribe, []
        for fn in unsubscribe:
            fn()
        self._pusher._events = None


def _read_golden(path: str | Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--golden {path}: {exc.strerror or exc}") from exc
