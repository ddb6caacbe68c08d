"""The device side of model updates: offers, chunks and rollback requests from MQTT, the staged
transfer, and the status topic. Verification and the swap run on one worker thread
(``updater.Updater``); MQTT callbacks only check, write and answer.

    agent = OtaAgent(daemon, config)
    agent.recover()          # at boot, before the pipelines: undo an uncommitted update
    pc = agent.effective(pc) # a pipeline runs its store's `current` model, if any
    agent.start(client)      # once the pipelines run: subscribe, resume staged transfers
    agent.tick()             # from the daemon's tick: flush, ask for missing chunks, expire
    agent.stop()
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import EdgeInferError, OtaRejected
from .protocol import (
    FINAL_STATES,
    ModelInfo,
    OtaStatus,
    base_topic,
    parse_chunk_topic,
    status_topic,
    to_ranges,
)

if TYPE_CHECKING:
    from ..config import Config, PipelineConfig
    from ..daemon import Daemon
    from ..mqtt.client import Message, MqttClient
    from .manifest import Manifest
    from .receiver import StagedTransfer

__all__ = ["OtaAgent", "crash_point"]

logger = logging.getLogger(__name__)

RESEND_AFTER_S = 2.0  # no chunk for this long while some are missing: say which again
PROGRESS_EVERY_S = 0.5  # status updates while chunks arrive, at most this often
CRASH_ENV = "EDGEINFER_OTA_CRASH_AT"
FREE_MARGIN = 16 * 1024 * 1024  # what an update leaves free on the state filesystem, at least


def crash_point(name: str) -> None:
    """Test hook: SIGKILL this process at ``name`` when ``EDGEINFER_OTA_CRASH_AT`` says so."""
    if os.environ.get(CRASH_ENV) == name:
        logger.warning("%s=%s: killing the daemon here (crash test)", CRASH_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


class OtaAgent:
    """Receives model updates for the pipelines of ``daemon`` (see ``docs/ota.md``).

    Raises:
        ConfigError: a trusted key file cannot be read.
    """

    def __init__(self, daemon: Daemon, config: Config) -> None:
        from .keys import load_trusted_keys
        from .store import ModelStore
        from .updater import Updater

        assert config.ota is not None and config.mqtt is not None
        self.daemon = daemon
        self.ota = config.ota
        self.prefix = config.mqtt.prefix
        self.device = config.resolved_device_id()
        self.max_model_mb = self.ota.max_model_mb or config.runtime.max_model_mb
        state = Path(config.runtime.resolved_state_dir())
        self.store = ModelStore(state / "ota", keep=self.ota.keep_versions)
        self.trusted = load_trusted_keys(self.ota.trusted_keys)
        self.client: MqttClient | None = None
        self.counters = {"offers": 0, "chunks": 0, "stray_chunks": 0, "bad_chunks": 0,
                         "rejected": 0, "committed": 0, "rolled_back": 0}
        self.last_status: OtaStatus | None = None
        self._lock = threading.RLock()
        self._active: StagedTransfer | None = None
        self._busy: str | None = None  # the transfer id being verified or applied
        self._jobs: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        self._unsubscribe: list[Any] = []
        self._seen_nonces: set[str] = set()
        self._interrupted: dict[str, Any] = {}
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
        self._interrupted = self.store.recover()
        for pipeline in self._interrupted:
            logger.warning("pipeline %s: the model update was not committed before the daemon "
                           "stopped; back on the previous model", pipeline)

    def effective(self, pc: PipelineConfig) -> PipelineConfig:
        """``pc`` with the model of its store's ``current`` link, when an update installed one."""
        import msgspec

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
        for pipeline in self._interrupted:
            self.publish("rolled_back", pipeline=pipeline, reason="interrupted",
                         message="the daemon stopped before the update was committed; "
                         "back on the previous model")
        self._resume_staged()
        self._worker = threading.Thread(target=self._work, name="edgeinfer-ota", daemon=True)
        self._worker.start()

    def _resume_staged(self) -> None:
        from .receiver import StagedTransfer

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
        from .manifest import open_offer, parse_offer
        from .receiver import StagedTransfer

        self.counters["offers"] += 1
        try:
            offer = parse_offer(message.payload)
            manifest = open_offer(offer, self.trusted, allow_unsigned=self.ota.allow_unsigned)
            self._check_target(manifest)
        except OtaRejected as exc:
            self._reject_offer(message.payload, exc, group)
            return
        if self._running_sha(manifest.pipeline) == manifest.sha256:
            self.publish("committed", manifest=manifest, transfer=offer.transfer.id, group=group,
                         message="this model already runs")
            return
        with self._lock:
            if self._busy is not None:
                if self._busy != offer.transfer.id:
                    self.publish("rejected", manifest=manifest, transfer=offer.transfer.id,
                                 group=group, reason="busy",
                                 message=f"update {self._busy} is being applied; push again "
                                 "when it is done")
                elif self.last_status is not None:
                    self._send(self.last_status)
                return
            active = self._active
            if active is not None and active.id == offer.transfer.id \
                    and active.chunk_size == offer.transfer.chunk_size:
                self._publish_progress(active)  # a re-offer: say what is still missing
                return
            if active is not None:
                logger.info("ota: transfer %s replaced by %s", active.id, offer.transfer.id)
                active.remove()
                self._active = None
            try:
                staged = StagedTransfer.create(self.store.staging_dir(offer.transfer.id),
                                               message.payload, offer, manifest, group)
                staged.remember_group()
            except OSError as exc:
                self.store.clear_staging(offer.transfer.id)
                self.publish("rejected", manifest=manifest, transfer=offer.transfer.id,
                             group=group, reason="storage", message=f"cannot stage it: {exc}")
                return
            if staged.complete:
                self._queue_apply(staged)
            else:
                self._active = staged
                self._publish_progress(staged)

    def _check_target(self, manifest: Manifest) -> None:
        pc = self._pipeline_config(manifest.pipeline)
        if pc is None:
            names = ", ".join(p.name for p in self.daemon.config.pipelines)
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

    def _reject_offer(self, payload: bytes, exc: OtaRejected, group: str | None) -> None:
        import json

        fields: dict[str, Any] = {}
        try:  # say which update was refused, from whatever part of the offer is readable
            raw = json.loads(payload)
            fields["transfer"] = str(raw["transfer"]["id"])[:16]
            m = json.loads(raw["manifest"])
            fields.update({k: str(m[k])[:64] for k in ("pipeline", "name", "version", "sha256")
                           if k in m})
        except Exception:  # a malformed offer: the reason says so
            pass
        self.publish("rejected", reason=exc.reason, message=str(exc), group=group, **fields)

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
                logger.warning("ota: chunk dropped: %s", exc)
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
        from .manifest import open_rollback

        try:
            request = open_rollback(message.payload, self.trusted,
                                    allow_unsigned=self.ota.allow_unsigned,
                                    seen=self._seen_nonces)
            if self._pipeline_config(request.pipeline) is None:
                raise OtaRejected("unknown_pipeline",
                                  f"this device has no pipeline {request.pipeline!r}")
        except OtaRejected as exc:
            self.publish("rejected", reason=exc.reason, message=str(exc), group=group)
            return
        with self._lock:
            if self._busy is not None:
                self.publish("rejected", pipeline=request.pipeline, group=group, reason="busy",
                             message=f"update {self._busy} is being applied")
                return
            self._busy = "rollback"
        self._jobs.put(("rollback", (request.pipeline, group)))

    # -- the worker --------------------------------------------------------------------------
    def _queue_apply(self, staged: StagedTransfer) -> None:
        self._busy = staged.id
        self.publish("verifying", staged=staged)
        self._jobs.put(("apply", staged))

    def _work(self) -> None:
        while True:
            kind, arg = self._jobs.get()
            if kind == "stop":
                return
            try:
                if kind == "apply":
                    self.updater.apply(arg)
                else:
                    self.updater.rollback(*arg)
            except Exception as exc:  # a bug must not leave the device busy forever
                logger.exception("ota: %s failed", kind)
                if not isinstance(exc, EdgeInferError):
                    self.publish("rejected", reason="internal", message=repr(exc))
            finally:
                with self._lock:
                    self._busy = None

    # -- status ----------------------------------------------------------------------------------
    def _publish_progress(self, staged: StagedTransfer) -> None:
        self.publish("receiving", staged=staged, missing=to_ranges(staged.missing()))

    def publish(self, state: str, *, staged: StagedTransfer | None = None,
                manifest: Manifest | None = None, **fields: Any) -> OtaStatus:
        """Publish (retained) and remember this device's OTA status."""
        m = manifest or (staged.manifest if staged is not None else None)
        if staged is not None:
            fields.setdefault("transfer", staged.id)
            fields.setdefault("group", staged.group)
            fields.setdefault("received", staged.received)
            fields.setdefault("chunks", staged.chunks)
        if m is not None:
            from .manifest import transfer_id

            fields.setdefault("transfer", transfer_id(m.sha256))
            fields.update(pipeline=m.pipeline, name=m.name, version=m.version, sha256=m.sha256)
        pipeline = fields.get("pipeline")
        if pipeline is not None and "previous" not in fields:
            fields["previous"] = self._running_info(pipeline)
        status = OtaStatus(device=self.device, state=state, ts=round(time.time(), 3),  # type: ignore[arg-type]
                           **fields)
        if state in FINAL_STATES and state in self.counters:
            self.counters[state] += 1
        self._send(status)
        if state in FINAL_STATES:
            level = logging.WARNING if state != "committed" else logging.INFO
            logger.log(level, "ota: %s %s %s: %s%s", status.pipeline or "-", status.version or "",
                       state, status.reason or "", f" ({status.message})" if status.message else "")
        return status

    def _send(self, status: OtaStatus) -> None:
        self.last_status = status
        self._last_status_at = time.monotonic()
        client = self.client
        if client is not None:
            client.publish(status_topic(self.prefix, self.device), status.encode(), qos=1,
                           retain=True)

    # -- the daemon's pipelines ------------------------------------------------------------------
    def _pipeline_config(self, name: str) -> PipelineConfig | None:
        return next((p for p in self.daemon.config.pipelines if p.name == name), None)

    def running(self, name: str) -> Any:
        return next((p for p in self.daemon.pipelines if p.name == name), None)

    def _running_sha(self, name: str) -> str | None:
        p = self.running(name)
        return None if p is None or p.model.closed else p.model.sha256

    def _running_info(self, name: str) -> ModelInfo | None:
        p = self.running(name)
        if p is None or p.model.closed:
            return None
        return ModelInfo(name=p.model.name, version=p.model.version, sha256=p.model.sha256)
