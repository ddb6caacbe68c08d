"""Applying a received model: verify it, install it in the store, swap it into the running
pipeline, and commit it after the health gate or roll it back (``docs/ota.md``).

Runs on the agent's worker thread, one update at a time. The running model keeps serving until
the pipeline switches between two frames; until the gate commits, the old session stays open
so that a rollback is a switch back, not a reload.
"""

from __future__ import annotations

import base64
import io
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from ..pipeline.build import load_pipeline_model
from ..config.ota import OtaConfig
from ..errors import EdgeInferError, ModelMemoryError, OtaRejected
from ..host import Host
from ..pipeline import Pipeline
from ..tasks import make_task
from ._crash import crash_point
from .filecheck import check_file
from .manifest import Target, build_manifest, encode, parse_time
from .protocol import ModelInfo, OtaStatus
from .replay import ReplayGuard
from .store import ModelStore
from .verify import trial_run

if TYPE_CHECKING:
    import numpy as np

    from ..config import PipelineConfig
    from ..model.model import Model
    from ..tasks import Task
    from .receiver import StagedTransfer
    from .store import StoreEntry

__all__ = ["UpdateAgent", "Updater"]

logger = logging.getLogger(__name__)

GATE_POLL_S = 0.1


class UpdateAgent(Protocol):
    """What the updater uses of its OTA agent (`edgeinfer.ota.agent.OtaAgent`)."""

    host: Host
    ota: OtaConfig
    device: str
    max_model_mb: float
    store: ModelStore
    replay: ReplayGuard

    @property
    def stopping(self) -> bool: ...

    def publish(self, state: str, *, staged: StagedTransfer | None = None,
                retain: bool = True, **fields: Any) -> OtaStatus: ...

    def running(self, name: str) -> Pipeline | None: ...

    def effective(self, pc: PipelineConfig) -> PipelineConfig: ...


class Updater:
    """Applies received models and rollback requests for ``agent``, on its worker thread."""

    def __init__(self, agent: UpdateAgent) -> None:
        self.agent = agent
        self.host = agent.host
        self.store = agent.store

    # -- a received model ------------------------------------------------------------------------
    def apply(self, staged: StagedTransfer) -> None:
        """Verify ``staged`` and, if it passes, swap it in and run the health gate."""
        agent, m = self.agent, staged.manifest
        crash_point("verify")
        try:
            entry, verified = self._verify_and_store(staged)
        except (OtaRejected, OSError, RecursionError, ValueError) as exc:
            staged.remove()  # before the status: whoever reads it finds no staging left
            if isinstance(exc, OtaRejected):
                reason, message = exc.reason, str(exc)
            elif isinstance(exc, OSError):  # the store cannot take it (disk full, read-only)
                reason, message = "storage", str(exc)
            else:  # a parser choking past check_file's guard
                reason, message = "bad_model", f"the model cannot be parsed: {exc!r:.200}"
            agent.publish("rejected", staged=staged, reason=reason, message=message)
            return
        except BaseException:
            staged.remove()
            raise
        staged.remove()
        logger.info("ota: %s %s verified; swapping it into pipeline %s", m.name, m.version,
                    m.pipeline)
        self._swap_and_gate(entry, staged, verified)

    def _verify_and_store(self, staged: StagedTransfer) -> tuple[StoreEntry, str]:
        """The checks and the trial run; the stored entry and what the speed check said."""
        agent, m = self.agent, staged.manifest
        check_file(staged.data_path, sha256=m.sha256, size=m.size, format=m.format,
                   max_model_mb=agent.max_model_mb)
        pc = self._config(m.pipeline)
        v = agent.ota.verify
        golden, atol, rtol = self._golden(staged)
        running = agent.running(m.pipeline)
        # The current model is timed in the same trial, in turns with the candidate, in the
        # same worker conditions: a latency taken at another moment says little on a busy box.
        current = running.model.path if running is not None and not running.model.closed \
            else None
        report = trial_run(staged.data_path, pc, self.host.config.runtime, golden=golden,
                           atol=atol, rtol=rtol, current=current,
                           max_slowdown=v.max_slowdown, memory_limit_mb=v.memory_limit_mb,
                           timeout_s=v.timeout_s, runs=v.runs, compare_s=v.compare_s)
        logger.info("ota: %s %s passed: %s", m.name, m.version, "; ".join(report.checks))
        entry = self.store.add(staged.data_path, staged.offer.manifest.encode(),
                               staged.offer.signature)
        crash_point("store")
        return entry, report.speed_note

    def _golden(self, staged: StagedTransfer) -> tuple[dict[str, np.ndarray] | None, float, float]:
        m = staged.manifest
        if m.golden is None or staged.offer.golden is None:
            return None, 1e-3, 1e-3
        import numpy as np

        try:
            with np.load(io.BytesIO(base64.b64decode(staged.offer.golden)),
                         allow_pickle=False) as npz:
                golden = {k: npz[k] for k in npz.files}
        except Exception as exc:
            raise OtaRejected("golden_mismatch", f"the golden file cannot be read: {exc}"
                              ) from None
        return golden, m.golden.atol, m.golden.rtol

    # -- swap and gate -------------------------------------------------------------------------
    def _swap_and_gate(self, entry: StoreEntry, staged: StagedTransfer, verified: str) -> None:
        agent, m = self.agent, staged.manifest
        pc = agent.effective(self._config(m.pipeline))
        new_pc = self._with_model(pc, entry, m.name, m.version)
        try:
            model = load_pipeline_model(new_pc, self.host.config.runtime)
        except EdgeInferError as exc:
            reason = "out_of_memory" if isinstance(exc, ModelMemoryError) else "load_failed"
            agent.publish("rejected", staged=staged, reason=reason, message=str(exc))
            return
        try:
            task = make_task(new_pc.task, model)
        except Exception as exc:
            model.close()
            agent.publish("rejected", staged=staged, reason="undecodable", message=str(exc))
            return
        update = {"transfer": staged.id, "request": staged.request, "name": m.name,
                  "version": m.version, "sha256": m.sha256, "group": staged.group}
        old_model: Model | None
        old_task: Task | None
        with self.host.exclusive():
            running = agent.running(m.pipeline)
            self._adopt_configured(m.pipeline, running)
            self.store.begin(m.pipeline, entry, update=update)
            crash_point("link")
            if running is not None:
                baseline = self._error_rate(running)
                old_model, old_task = running.model, running.task
                running.swap_model(model, task)
            else:  # the pipeline could not start at boot: start it on the new model
                model.close()
                old_model = old_task = None
                baseline = 0.0
                try:
                    self.host.start_pipeline(pc.name)
                except EdgeInferError as exc:
                    self.store.rollback_pending(m.pipeline)
                    agent.publish("rolled_back", staged=staged, reason="load_failed",
                                  message=f"the pipeline does not start on it: {exc}")
                    return
        agent.publish("applied", staged=staged, message=f"verified; {verified}")
        crash_point("swap")
        verdict = self._gate(m.pipeline, baseline)
        if verdict is None:  # the daemon is stopping: uncommitted, undone at the next boot
            return
        previous = _info(old_model)
        if verdict == "":
            self.store.commit(m.pipeline)
            agent.replay.accept(m.pipeline, m.sequence, downgrade=m.downgrade,
                                request=staged.request, expires=parse_time(m.expires))
            if old_model is not None:
                old_model.close()
            agent.publish("committed", staged=staged, previous=previous,
                          message=f"verified; {verified}")
        else:
            self._undo(m.pipeline, model, old_model, old_task)
            agent.publish("rolled_back", staged=staged, reason="health_gate", message=verdict,
                          previous=previous)
        self.host.announce()

    def _gate(self, pipeline: str, baseline_rate: float) -> str | None:
        """``""`` to commit, a reason to roll back, None when the daemon stops meanwhile."""
        h = self.agent.ota.health
        allowed = max(h.max_error_rate, baseline_rate)
        start = time.monotonic()
        crash_point("gate")
        while not self.agent.stopping:
            p = self.agent.running(pipeline)
            if p is None:
                return "the pipeline stopped during the health gate"
            if p.error is not None:
                return f"the pipeline failed: {p.error}"
            ok, errors = p.model_ok, p.model_errors
            if errors > allowed * max(h.min_inferences, ok + errors):
                return (f"{errors} errors in {ok + errors} inferences (allowed "
                        f"{allowed:.0%}); last: {p.stats.last_error}")
            if ok >= h.min_inferences:
                return ""
            if time.monotonic() - start > h.window_s:
                if ok + errors == 0 and (p.paused or p.join(0) or p.source.waiting):
                    logger.info("ota: pipeline %s had no frames during the health gate; "
                                "committing on verification", pipeline)
                    return ""
                return (f"only {ok} of {h.min_inferences} inferences succeeded in "
                        f"{h.window_s:g} s")
            time.sleep(GATE_POLL_S)
        return None

    def _undo(self, pipeline: str, model: Model, old_model: Model | None,
              old_task: Task | None) -> None:
        with self.host.exclusive():
            self.store.rollback_pending(pipeline)
            p = self.agent.running(pipeline)
            if p is not None and p.model is model and old_model is not None \
                    and old_task is not None:
                p.swap_model(old_model, old_task)
                model.close()
                return
        if old_model is not None:  # the pipeline was rebuilt meanwhile: rebuild it on the old
            old_model.close()
        model.close()
        self.host.restart_pipeline(pipeline)

    def _adopt_configured(self, pipeline: str, running: Pipeline | None) -> None:
        """Before the first update of a pipeline, put the model it runs from its config into
        the store as ``current``, so that the update's ``previous`` (rollback target) is it."""
        if self.store.current(pipeline) is not None or running is None or running.model.closed:
            return
        model = running.model
        try:  # under the name results carry, not the file's stem: a rollback keeps the name
            manifest = build_manifest(model.path, pipeline=pipeline,
                                      version=model.version or "configured",
                                      name=_store_name(model.name, model.path),
                                      target=Target(device=self.agent.device), sequence=0)
            entry = self.store.add(model.path, encode(manifest), None)
        except EdgeInferError as exc:  # no rollback target then; the update goes on
            logger.warning("ota: cannot keep the configured model of %s for rollbacks: %s",
                           pipeline, exc)
            return
        self.store.begin(pipeline, entry)
        self.store.commit(pipeline)

    # -- a rollback request ------------------------------------------------------------------
    def rollback(self, pipeline: str, group: str | None, request: str | None = None) -> None:
        """Go back to the store's ``previous`` model of ``pipeline`` (no gate: it ran before)."""
        agent = self.agent
        try:
            entry = self.store.rollback(pipeline)
        except OtaRejected as exc:
            agent.publish("rejected", request=request, pipeline=pipeline, group=group,
                          reason=exc.reason, message=str(exc))
            return
        pc = agent.effective(self._config(pipeline))
        try:
            model = load_pipeline_model(pc, self.host.config.runtime)
            task = make_task(pc.task, model)
        except Exception as exc:
            self.store.rollback(pipeline)  # switch the links back: the current one stays
            agent.publish("rejected", request=request, pipeline=pipeline, group=group,
                          reason="load_failed",
                          message=f"the previous model does not load: {exc}")
            return
        with self.host.exclusive():
            p = agent.running(pipeline)
            replaced = p.swap_model(model, task) if p is not None else None
        if replaced is not None:
            replaced.close()
        elif p is None:
            model.close()
            self.host.restart_pipeline(pipeline)
        manifest = entry.manifest or {}
        agent.publish("rolled_back", request=request, pipeline=pipeline, group=group,
                      reason="requested",
                      name=manifest.get("name"), version=manifest.get("version"),
                      sha256=entry.sha256, previous=_info(replaced),
                      message="rolled back on request")
        self.host.announce()

    # -- helpers ---------------------------------------------------------------------------------
    def _config(self, pipeline: str) -> PipelineConfig:
        pc = next((p for p in self.host.config.pipelines if p.name == pipeline), None)
        if pc is None:
            raise OtaRejected("unknown_pipeline", f"pipeline {pipeline!r} is no longer configured")
        return pc

    @staticmethod
    def _with_model(pc: PipelineConfig, entry: StoreEntry, name: str,
                    version: str) -> PipelineConfig:
        model = msgspec.structs.replace(pc.model, path=str(entry.path), name=name,
                                        version=version)
        return msgspec.structs.replace(pc, model=model)

    @staticmethod
    def _error_rate(p: Pipeline) -> float:
        s = p.stats
        return s.errors / (s.processed + s.errors) if s.processed + s.errors else 0.0


def _info(model: Model | None) -> ModelInfo | None:
    if model is None:
        return None
    return ModelInfo(name=model.name, version=model.version, sha256=model.sha256)


def _store_name(name: str | None, path: str | Path) -> str | None:
    """The configured model name when the store can file it under that name, else None
    (the file's stem, sanitised)."""
    if name and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) and ".." not in name:
        return name
    if name:
        logger.warning("ota: model name %r cannot name a store folder; keeping the configured "
                       "model under %s", name, Path(path).stem)
    return None
