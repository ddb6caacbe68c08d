"""The device side of model updates: offers, chunks and rollback requests from MQTT, the staged
transfer, and the status topic. Verification and the swap run on one worker thread
(``updater.Updater``); MQTT callbacks only check, write and answer.

    agent = OtaAgent(host, config)  # host: the daemon as an `edgeinfer.host.Host`
    agent.recover()          # at boot, before the pipelines: undo an uncommitted update
    pc = agent.effective(pc) # a pipeline runs its store's `current` model, if any
    agent.start(client)      # once the pipelines run: subscribe, resume staged transfers
    agent.tick()             # from the daemon's tick: flush, ask for missing chunks, expire
    agent.stop()
"""

# Over 450 lines: one state machine (active transfer, busy request, last status) under one lock.

from __future__ import annotations

import hashlib
import logging
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..errors import EdgeInferError, OtaRejected
from ..host import Host
from ..keys import load_trusted_keys
from ..pipeline import Pipeline
from ._crash import crash_point
from .manifest import check_time, check_transfer, open_manifest, transfer_id
from .offer import parse_offer
from .protocol import (
    FINAL_STATES,
    ModelInfo,
    OtaStatus,
    base_topic,
    parse_chunk_topic,
    status_topic,
    to_ranges,
)
from .receiver import StagedTransfer
from .replay import ReplayGuard
from .rollback import open_rollback, parse_rollback
from .signature import parse_time, request_id
from .store import ModelStore
from .updater import Updater

if TYPE_CHECKING:
    from ..config import Config, PipelineConfig
    from ..mqtt.client import Message, MqttClient
    from .manifest import Manifest
    from .offer import Offer

__all__ = ["OtaAgent"]

logger = logging.getLogger(__name__)

RESEND_AFTER_S = 2.0  # no chunk for this long while some are missing: say which again
PROGRESS_EVERY_S = 0.5  # status updates while chunks arrive, at most this often
FREE_MARGIN = 16 * 1024 * 1024  # what an update leaves free on the state filesystem, at least
# Refusals anyone holding a capture can provoke at will: published, but not retained, so that
# they never displace the retained status of a real update.
REPLAY_REASONS = frozenset({"wrong_target", "downgrade", "replayed", "superseded",
                            "expired_manifest", "not_yet_valid"})


class OtaAgent:
    """Receives model updates for the pipelines of ``host`` (see ``docs/ota.md``).

    Raises:
        ConfigError: a trusted key file cannot be read.
    """

    def __init__(self, host: Host, config: Config) -> None:
        assert config.ota is not None and config.mqtt is not None
        self.host = host
        self.ota = config.ota
        self.prefix = config.mqtt.prefix
        self.device = config.resolved_device_id()
        self.max_model_mb = self.ota.max_model_mb or config.runtime.max_model_mb
        state = Path(config.runtime.resolved_state_dir())
        self.store = ModelStore(state / "ota", keep=self.ota.keep_versions)
        self.replay = ReplayGuard(state / "ota")
        self.trusted = load_trusted_keys(self.ota.trusted_keys)
        self.client: MqttClient | None = None
        self.counters = {"offers": 0, "chunks": 0, "stray_chunks": 0, "bad_chunks": 0,
                         "unverified": 0, "rejected": 0, "committed": 0, "rolled_back": 0}
        self.last_status: OtaStatus | None = None
        self._lock = threading.RLock()
        self._active: StagedTransfer | None = None
        self._busy: str | None = None  # the request id being verified or applied
        self._busy_status: OtaStatus | None = None  # the last status about it
        self._jobs: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self._unsubscribe: list[Any] = []
        self._interrupted: dict[str, str | None] = {}  # pipeline -> its update's request id
        self._last_status_at = 0.0
        self.updater = Updater(self)
        if self.ota.allow_unsigned:
            logger.warning("ota.allow_unsigned is on: this device installs UNSIGNED models from "
                           "anyone who can publish to its topics; for development only")
        if not self.trusted and not self.ota.allow_unsigned:
            logger.warning("ota: no trusted key could be read; every update will be refused")

    # -- boot ------------------------------------------------------------------------------------
    def recover(self) -> None:
        """Before the pipelines start: an update applied but not committed when the daemon
        stopped is undone (its status becomes ``rolled_back``, ``interrupted``)."""
        requests: dict[str, str | None] = {}
        for folder in self.store.pipeline_dirs():
            pending = self.store.pending(folder.name)
            if pending is not None:
                update = pending.get("update")
                request = update.get("request") if isinstance(update, dict) else None
                requests[folder.name] = request if isinstance(request, str) else None
        self._interrupted = {p: requests.get(p) for p in self.store.recover()}
        for pipeline in self._interrupted:
            logger.warning("pipeline %s: the model update was not committed before the daemon "
                           "stopped; back on the previous model", pipeline)

    def effective(self, pc: PipelineConfig) -> PipelineConfig:
        """``pc`` with the model of its store's ``current`` link, when an update installed one."""
        entry = self.store.current(pc.name)
        if entry is None:
            return pc
        manifest = entry.manifest or {}
        model = msgspec.structs.replace(
            pc.model, path=str(entry.path), name=manifest.get("name") or pc.model.name,
            version=manifest.get("version") or pc.model.version)
        return msgspec.structs.replace(pc, model=model)

    def start(self, client: MqttClient) -> None:
        """Subscribe to this device's and its groups' OTA topics, report updates undone at
        boot, and resume staged transfers."""
        self.client = client
        bases: list[tuple[str, str | None]] = [(base_topic(self.prefix, device=self.device),
                                                None)]
        bases += [(base_topic(self.prefix, group=g), g) for g in self.ota.groups]
        for base, group in bases:
            self._unsubscribe += [
                client.subscribe(f"{base}/ota/offer", 1, self._handler(self._on_offer, group)),
                client.subscribe(f"{base}/ota/chunk/+/+", 1,
                                 self._handler(self._on_chunk, group)),
                client.subscribe(f"{base}/ota/rollback", 1,
                                 self._handler(self._on_rollback, group)),
            ]
        for pipeline, request in self._interrupted.items():
            self.publish("rolled_back", pipeline=pipeline, request=request, reason="interrupted",
                         message="the daemon stopped before the update was committed; "
                         "back on the previous model")
        self._resume_staged()
        self._worker = threading.Thread(target=self._work, name="edgeinfer-ota", daemon=True)
        self._worker.start()

    def _resume_staged(self) -> None:
        folders = sorted((p for p in (self.store.root / "staging").glob("*") if p.is_dir()),
                         key=lambda p: p.stat().st_mtime)
        for i, folder in enumerate(folders):
            expired = time.time() - folder.stat().st_mtime > self.ota.transfer_timeout_s
            try:
                if expired or i != len(folders) - 1:  # one transfer at a time: the newest
                    raise OtaRejected("expired", f"staged transfer {folder.name} expired")
                staged = StagedTransfer.load(folder, self.trusted,
                                             allow_unsigned=self.ota.allow_unsigned)
            except OtaRejected as exc:
                logger.warning("ota: dropping staged transfer %s: %s", folder.name, exc)
                self.store.clear_staging(folder.name)
                continue
            if staged.complete:
                logger.info("ota: transfer %s was complete when the daemon stopped; verifying "
                            "it again", staged.id)
                self._queue_apply(staged)
            else:
                logger.info("ota: resuming transfer %s (%d of %d chunks)", staged.id,
                            staged.received, staged.chunks)
                self._active = staged
                self._publish_progress(staged)

    # -- running ---------------------------------------------------------------------------------
    def tick(self) -> None:
        """Make received chunks durable, ask again for missing ones, expire stale transfers."""
        with self._lock:
            staged = self._active
            if staged is None:
                return
            staged.flush()
            if staged.received:
                crash_point("chunk")  # mid-transfer, some chunks on disk
            idle = time.monotonic() - staged.last_chunk
            if idle > self.ota.transfer_timeout_s:
                self._active = None
                staged.remove()
                self.publish("rejected", staged=staged, reason="expired",
                             message=f"no chunk for {idle:.0f} s")
            elif idle > RESEND_AFTER_S and time.monotonic() - self._last_status_at > RESEND_AFTER_S:
                self._publish_progress(staged)

    def stop(self) -> None:
        self._stop.set()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe.clear()
        self._jobs.put(("stop", None))
        if self._worker is not None:
            self._worker.join(10)
        with self._lock:
            if self._active is not None:
                self._active.close()
                self._active = None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            active = self._active
            receiving = None if active is None else {
                "transfer": active.id, "received": active.received, "chunks": active.chunks}
        return {**self.counters, "busy": self._busy, "receiving": receiving,
                "state": self.last_status.state if self.last_status else None}

    # -- messages --------------------------------------------------------------------------------
    def _handler(self, method: Any, group: str | None) -> Any:
        def handle(message: Message) -> None:
            try:
                method(message, group)
            except Exception:  # never let one message break the network thread
                logger.exception("ota: handling %s failed", message.topic)
        return handle

    def _on_offer(self, message: Message, group: str | None) -> None:
        self.counters["offers"] += 1
        received = hashlib.sha256(message.payload).hexdigest()[:16]  # what no signature vouches for
        try:
            offer = parse_offer(message.payload)
        except OtaRejected as exc:
            self._refuse_unverified(exc, received, group, "offer")
            return
        request = request_id(offer.manifest, offer.signature)
        try:  # a forged signature gives another id than the real offer's
            manifest = open_manifest(offer, self.trusted, allow_unsigned=self.ota.allow_unsigned)
        except OtaRejected as exc:
            self._refuse_unverified(exc, request, group, "offer")
            return
        try:  # a real offer's copy with an edited transfer section must not answer for it
            check_transfer(offer, manifest)
        except OtaRejected as exc:
            self._refuse_unverified(exc, received, group, "offer")
            return
        with self._lock:  # the same signed offer again: say where it stands
            active = self._active
            if active is not None and active.request == request:
                self._publish_progress(active)
                return
            if self._busy == request and self._busy_status is not None:
                self._send(self._busy_status)
                return
        running = self._running_sha(manifest.pipeline) == manifest.sha256
        try:
            self._check_offer(manifest, request, running)
        except OtaRejected as exc:
            self.publish("rejected", manifest=manifest, request=request, group=group,
                         reason=exc.reason, message=str(exc),
                         retain=exc.reason not in REPLAY_REASONS)
            return
        if running:
            self._already_running(manifest, request, group)
            return
        with self._lock:
            self._stage(message.payload, offer, manifest, request, group)

    def _check_offer(self, manifest: Manifest, request: str, running: bool) -> None:
        check_time(manifest)
        self._check_target(manifest)
        self.replay.check_sequence(manifest.pipeline, manifest.sequence,
                                   downgrade=manifest.downgrade, request=request,
                                   running=running)

    def _already_running(self, manifest: Manifest, request: str, group: str | None) -> None:
        """A signed offer of the model the pipeline runs: nothing to transfer; the status
        names the running model (not the offer's claims) and the sequence is recorded."""
        info = self._running_info(manifest.pipeline)
        self.replay.accept(manifest.pipeline, manifest.sequence, downgrade=manifest.downgrade,
                           request=request, expires=parse_time(manifest.expires))
        self.publish("committed", request=request, transfer=manifest.sha256[:16], group=group,
                     pipeline=manifest.pipeline, name=info.name if info else None,
                     version=info.version if info else None, sha256=manifest.sha256,
                     message="this model already runs; nothing transferred")

    def _stage(self, payload: bytes, offer: Offer, manifest: Manifest, request: str,
               group: str | None) -> None:
        """Start receiving a checked offer (the lock held)."""
        if self._busy is not None:
            self.publish("rejected", manifest=manifest, request=request, group=group,
                         reason="busy", message=f"update {self._busy} is being applied; push "
                         "again when it is done")
            return
        active = self._active
        if active is not None:
            if manifest.sequence < active.manifest.sequence and not manifest.downgrade:
                # an older signed offer (a replay?) never cancels a newer transfer under way
                self.publish("rejected", manifest=manifest, request=request, group=group,
                             reason="superseded", message=f"transfer {active.request} of a "
                             f"later sequence ({active.manifest.sequence}) is under way",
                             retain=False)
                return
            logger.info("ota: transfer %s replaced by %s", active.request, request)
            if active.id == offer.transfer.id:
                active.close()  # the same file: the new offer resumes its chunks
            else:
                active.remove()
            self._active = None
        try:
            staged = StagedTransfer.create(self.store.staging_dir(offer.transfer.id),
                                           payload, offer, manifest, group)
            staged.remember_group()
        except OSError as exc:
            self.store.clear_staging(offer.transfer.id)
            self.publish("rejected", manifest=manifest, request=request, group=group,
                         reason="storage", message=f"cannot stage it: {exc}")
            return
        if staged.complete:
            self._queue_apply(staged)
        else:
            self._active = staged
            self._publish_progress(staged)

    def _check_target(self, manifest: Manifest) -> None:
        t = manifest.target
        if (t.device is not None and t.device != self.device) or (
                t.group is not None and t.group not in self.ota.groups):
            groups = ", ".join(self.ota.groups) or "none"
            raise OtaRejected("wrong_target", f"the update is signed for {t}; this is device "
                              f"{self.device} (groups: {groups})")
        pc = self._pipeline_config(manifest.pipeline)
        if pc is None:
            names = ", ".join(p.name for p in self.host.config.pipelines)
            raise OtaRejected("unknown_pipeline", f"this device has no pipeline "
                              f"{manifest.pipeline!r} (it has: {names})")
        tag = type(pc.task).__struct_config__.tag
        if manifest.task is not None and manifest.task != tag:
            raise OtaRejected("wrong_task", f"the model is for task {manifest.task!r}; pipeline "
                              f"{pc.name} runs {tag!r}")
        if manifest.size > self.max_model_mb * 1024 * 1024:
            raise OtaRejected("oversize", f"the model has {manifest.size / 2**20:.1f} MiB; this "
                              f"device takes at most {self.max_model_mb:g} MiB (ota.max_model_mb)")
        free = shutil.disk_usage(self.store.root).free
        if free < 2 * manifest.size + FREE_MARGIN:  # the staged file, then its copy in the store
            raise OtaRejected("storage", f"{free / 2**20:.0f} MiB free in {self.store.root}; the "
                              f"update needs {2 * manifest.size / 2**20:.0f} MiB and a margin")

    def _refuse_unverified(self, exc: OtaRejected, request: str | None, group: str | None,
                           what: str) -> None:
        """An offer or rollback request that did not pass its signature check (or is not
        even well formed): it changes nothing, and its refusal names only its own request id
        (none of its unverified claims) and is not retained, so it replaces no status."""
        self.counters["unverified"] += 1
        logger.warning("ota: refused a %s before trusting it (%s): %s", what, exc.reason, exc)
        self.publish("rejected", request=request, group=group, reason=exc.reason,
                     message=str(exc), retain=False)

    def _on_chunk(self, message: Message, group: str | None) -> None:
        parsed = parse_chunk_topic(message.topic)
        if parsed is None:
            return
        transfer, index = parsed
        with self._lock:
            staged = self._active
            if staged is None or staged.id != transfer:
                self.counters["stray_chunks"] += 1
                return
            try:
                new = staged.write(index, message.payload)
            except OtaRejected as exc:
                self.counters["bad_chunks"] += 1
                if staged.bad_chunks & (staged.bad_chunks - 1) == 0:  # 1st, 2nd, 4th...: no flood
                    logger.warning("ota: chunk dropped (%d so far in %s): %s", staged.bad_chunks,
                                   staged.request, exc)
                return
            except OSError as exc:  # a full or failing disk: the transfer cannot finish
                self._active = None
                staged.remove()
                self.publish("rejected", staged=staged, reason="storage",
                             message=f"cannot write chunk {index}: {exc}")
                return
            self.counters["chunks"] += 1
            if staged.complete:
                staged.flush()
                self._active = None
                self._queue_apply(staged)
            elif new and time.monotonic() - self._last_status_at > PROGRESS_EVERY_S:
                # only on progress: a status with the same count reads as a stall report
                self._publish_progress(staged)

    def _on_rollback(self, message: Message, group: str | None) -> None:
        request = None
        try:
            env = parse_rollback(message.payload)
            request = request_id(env.request, env.signature)
            req, request = open_rollback(message.payload, self.trusted,
                                         allow_unsigned=self.ota.allow_unsigned)
        except OtaRejected as exc:
            self._refuse_unverified(exc, request, group, "rollback request")
            return
        try:
            t = req.target
            if (t.device is not None and t.device != self.device) or (
                    t.group is not None and t.group not in self.ota.groups):
                raise OtaRejected("wrong_target", f"the rollback request is signed for {t}; "
                                  f"this is device {self.device}")
            if self._pipeline_config(req.pipeline) is None:
                raise OtaRejected("unknown_pipeline",
                                  f"this device has no pipeline {req.pipeline!r}")
            self.replay.use_nonce(req.nonce, parse_time(req.created))
        except OtaRejected as exc:
            self.publish("rejected", request=request, pipeline=req.pipeline, group=group,
                         reason=exc.reason, message=str(exc),
                         retain=exc.reason not in REPLAY_REASONS)
            return
        with self._lock:
            if self._busy is not None:
                self.publish("rejected", request=request, pipeline=req.pipeline, group=group,
                             reason="busy", message=f"update {self._busy} is being applied")
                return
            self._busy = request
            self._busy_status = None
        self._jobs.put(("rollback", (req.pipeline, group, request)))

    # -- the worker --------------------------------------------------------------------------
    def _queue_apply(self, staged: StagedTransfer) -> None:
        self._busy = staged.request
        self._busy_status = None
        self.publish("verifying", staged=staged)
        self._jobs.put(("apply", staged))

    def _work(self) -> None:
        while True:
            kind, arg = self._jobs.get()
            if kind == "stop":
                return
            request = self._busy
            try:
                if kind == "apply":
                    self.updater.apply(arg)
                else:
                    self.updater.rollback(*arg)
            except Exception as exc:  # a bug must not leave the device busy forever
                logger.exception("ota: %s failed", kind)
                if not isinstance(exc, EdgeInferError):
                    self.publish("rejected", request=self._busy, reason="internal",
                                 message=repr(exc))
            finally:
                with self._lock:
                    if self._busy == request:  # not a newer one, accepted after our outcome
                        self._busy = None

    # -- status ----------------------------------------------------------------------------------
    def _publish_progress(self, staged: StagedTransfer) -> None:
        self.publish("receiving", staged=staged, missing=to_ranges(staged.missing()))

    def publish(self, state: str, *, staged: StagedTransfer | None = None,
                manifest: Manifest | None = None, retain: bool = True,
                **fields: Any) -> OtaStatus:
        """Publish (retained unless ``retain`` is off) and remember this device's OTA status."""
        m = manifest or (staged.manifest if staged is not None else None)
        if staged is not None:
            fields.setdefault("request", staged.request)
            fields.setdefault("transfer", staged.id)
            fields.setdefault("group", staged.group)
            fields.setdefault("received", staged.received)
            fields.setdefault("chunks", staged.chunks)
        if m is not None:
            fields.setdefault("transfer", transfer_id(m.sha256))
            fields.update(pipeline=m.pipeline, name=m.name, version=m.version, sha256=m.sha256)
        pipeline = fields.get("pipeline")
        if pipeline is not None and "previous" not in fields:
            fields["previous"] = self._running_info(pipeline)
        status = OtaStatus(device=self.device, state=state, ts=round(time.time(), 3),  # type: ignore[arg-type]
                           **fields)
        if state in FINAL_STATES and state in self.counters:
            self.counters[state] += 1
        if state in FINAL_STATES:
            # Free before telling: a pusher that sends its next update the moment it reads
            # this outcome must not be refused as busy with the one that just ended.
            with self._lock:
                if status.request is not None and status.request == self._busy:
                    self._busy = None
        self._send(status, retain=retain)
        if state in FINAL_STATES:
            level = logging.WARNING if state != "committed" else logging.INFO
            logger.log(level, "ota: %s %s %s: %s%s", status.pipeline or "-", status.version or "",
                       state, status.reason or "", f" ({status.message})" if status.message else "")
        return status

    def _send(self, status: OtaStatus, *, retain: bool = True) -> None:
        if retain:
            self.last_status = status
            self._last_status_at = time.monotonic()
        if status.request is not None and status.request == self._busy:
            self._busy_status = status
        client = self.client
        if client is not None:
            client.publish(status_topic(self.prefix, self.device), status.encode(), qos=1,
                           retain=retain)

    # -- the daemon's pipelines ------------------------------------------------------------------
    def _pipeline_config(self, name: str) -> PipelineConfig | None:
        return next((p for p in self.host.config.pipelines if p.name == name), None)

    def running(self, name: str) -> Pipeline | None:
        return next((p for p in self.host.pipelines if p.name == name), None)

    def _running_sha(self, name: str) -> str | None:
        p = self.running(name)
        return None if p is None or p.model.closed else p.model.sha256

    def _running_info(self, name: str) -> ModelInfo | None:
        p = self.running(name)
        if p is None or p.model.closed:
            return None
        return ModelInfo(name=p.model.name, version=p.model.version, sha256=p.model.sha256)
