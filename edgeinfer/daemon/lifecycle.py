"""``edgeinfer run``: startup -> tick loop -> graceful shutdown. Signals only set flags.

Startup loads every pipeline's model, checks it against its task, opens sinks and sources and
starts the stage threads. A pipeline that fails to start is reported and left out, unless it
is ``required`` (then the daemon fails). The tick loop ends when every pipeline has finished
(file sources end) or on SIGINT/SIGTERM; a second signal forces an immediate exit.

Under systemd the daemon speaks sd_notify (``edgeinfer.systemd``): ``READY=1`` once every
pipeline runs, ``STATUS=`` every few seconds, ``RELOADING=1``/``READY=1`` around a reload,
``STOPPING=1`` at shutdown, and ``WATCHDOG=1`` only while every pipeline is healthy and the
command thread runs. A stuck pipeline is rebuilt, within the budget of the stall policy
(`edgeinfer.daemon.health`); then the pings stop and systemd kills and restarts us.

The control plane (the MQTT link, the OTA agent, the web view, the metrics endpoint) gets the
daemon as an `edgeinfer.host.Host`, never as a `Daemon`.
"""

# Over 450 lines: one class whose parts share its state: lifecycle, reload, and the Host side.

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from .. import systemd
from ..pipeline.build import (
    assemble,
    early_source,
    load_pipeline_model,
    pipeline_path,
)
from ..config import Config, PipelineConfig, load_config
from ..control.commands import command_policy, run_unsigned
from ..control.handlers import CommandHandlers
from ..control.link import MqttLink
from ..control.metrics import MetricsServer
from ..control.status import device_birth, device_stats
from ..errors import ConfigError, EdgeInferError, PipelineBuildError
from ..ota.agent import OtaAgent
from ..pipeline import Pipeline
from ..runtime.memory import return_frames_to_the_os, set_memory_budget
from ..sources import discard
from ..model.pool import model_pool
from ..statelock import LOCK_NAME, StateLock
from .early import Early, release
from .health import RESTART_BUDGET, RESTART_CLOSE_S, StallWatch, stall_policy
from .reload import result_path, write_result
from .startable import pipeline_problems

if TYPE_CHECKING:
    from ..model.model import Model
    from ..web import WebServer

logger = logging.getLogger("edgeinfer.daemon")  # the name users filter on: kept from daemon.py

TICK_S = 0.5
EXIT_FORCED = 130
STATUS_INTERVAL_S = 5.0  # how often STATUS= is refreshed


class Daemon:
    """Runs the pipelines of one config until they end or a signal arrives.

    Args:
        config: The validated config.
        context: Passed to every source and sink (e.g. an MQTT ``subscribe``).
        stats_interval_s: How often the tick logs a stats line (0: never).
        flush_timeout_s: How long shutdown waits for the outbox to reach the broker.
        stall_s: Seconds without a processed frame after which a live, unpaused pipeline is
            stuck (default: ``max(MIN_STALL_S, the watchdog interval)``).
        restart_budget, restart_window_s: Internal restarts allowed per pipeline and window
            (see `edgeinfer.daemon.health.stall_policy`).
        early: Sources built before the daemon was (`edgeinfer.daemon.early.start_captures`):
            a pipeline uses the one built for its source config; the rest are discarded.

    It is the `edgeinfer.host.Host` of the control plane.
    """

    def __init__(self, config: Config, *, config_path: str | None = None,
                 stats_interval_s: float = 0.0, flush_timeout_s: float = 5.0,
                 stall_s: float | None = None, restart_budget: int = RESTART_BUDGET,
                 restart_window_s: float | None = None, early: Early | None = None,
                 **context: Any) -> None:
        self.config = config
        self._early: Early = dict(early or {})
        self.config_path = config_path
        self.context = context
        self.stats_interval_s = stats_interval_s
        self.flush_timeout_s = flush_timeout_s
        self.pipelines: list[Pipeline] = []
        self.failed: dict[str, str] = {}
        self.link: MqttLink | None = None  # when the config has an mqtt: section
        self.metrics: MetricsServer | None = None  # when metrics: is enabled
        self.ota: OtaAgent | None = None  # when the config has an ota: section
        self.web: WebServer | None = None  # when the config has an http: section
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._signals = 0
        self._reload_lock = threading.Lock()
        self._reload_requested = threading.Event()
        self._reloads = 0  # SIGHUP reloads so far: the generation in the reload outcome file
        self.watchdog_s = systemd.watchdog_interval()
        self.stall_s, self.restart_window_s = stall_policy(
            self.watchdog_s, stall_s, restart_budget, restart_window_s)
        self.restart_budget = restart_budget
        self.stalls = StallWatch(self.stall_s, self.restart_window_s, restart_budget)
        self._rate_mark: dict[str, tuple[Pipeline, int, float]] = {}
        self._next_ping = 0.0
        self._next_status = 0.0
        self._state_lock: StateLock | None = None  # held from startup to shutdown

    @property
    def restarts(self) -> dict[str, int]:
        """Internal restarts of stuck pipelines so far, per pipeline."""
        return self.stalls.restarts

    @property
    def stuck(self) -> str | None:
        """A pipeline whose restart budget is spent (the watchdog pings stop), or ``None``."""
        return self.stalls.stuck

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> int:
        """Start, tick until done or signalled, shut down; returns the exit code."""
        self._install_signal_handlers()
        try:
            self.startup()
            self.main_loop()
        finally:
            self.shutdown()
        errors = [p.error for p in self.pipelines if p.error is not None]
        if errors:
            first = errors[0]
            return first.exit_code if isinstance(first, EdgeInferError) else 70
        return 0

    def startup(self) -> None:
        # One daemon per state directory (outbox, model store, probe decisions): a second one
        # refuses here with AlreadyRunningError naming the first.
        self._state_lock = StateLock(self.config.runtime.resolved_state_dir() / LOCK_NAME)
        self._state_lock.acquire()
        set_memory_budget(self.config.runtime.memory_budget_mb)
        return_frames_to_the_os()
        if self.config.mqtt is not None:
            self.link = MqttLink(self.config, self)
            self.link.start()  # before the pipelines: MQTT sources subscribe through it
            for key, value in self.link.context().items():
                self.context.setdefault(key, value)
        if self.config.ota is not None:
            self.ota = OtaAgent(self, self.config)
            self.ota.recover()  # an update not committed before a stop or crash is undone
        for pc in self.config.pipelines:
            try:
                self.pipelines.append(self._start_pipeline(pc))
            except EdgeInferError as exc:
                if pc.required:
                    raise
                self.failed[pc.name] = str(exc)
                logger.error("pipeline %s not started: %s", pc.name, exc)
        release(self._early)
        if not self.pipelines:
            reasons = "; ".join(f"{k}: {v}" for k, v in self.failed.items()) or "none configured"
            raise ConfigError(f"no pipeline could start ({reasons})")
        if self.link is not None:
            # OTA subscribes before the birth, as the command server does: a retained "online"
            # means an offer published now is taken (one connection: the broker handles the
            # SUBSCRIBE before the birth's PUBLISH). After it, an offer sent on seeing the birth
            # or the first result could arrive before the subscription and be lost unanswered.
            if self.ota is not None and self.link.plumbing is not None:
                self.ota.start(self.link.plumbing.client)
            self.link.ready()
        if self.config.metrics is not None and self.config.metrics.enabled:
            self.metrics = MetricsServer(self, self.config.metrics)
            self.metrics.start()
        if self.config.http is not None:
            from ..web import WebServer  # aiohttp: imported only when the web view is on

            self.web = WebServer(self.config.http, self)
            self.web.start()
            logger.info("web view on %s", self.web.url)
        systemd.ready(self.status_line())

    def _start_pipeline(self, pc: PipelineConfig, config: Config | None = None) -> Pipeline:
        """Load, assemble and start one pipeline of ``config`` (default: the running one);
        nothing is left open if it fails. What `validate-config` finds in it is refused first,
        with its words, before the model loads. A model installed by an update (the OTA
        store's ``current``) replaces the configured one; if it cannot load, the configured
        model is used.

        Raises:
            EdgeInferError: the pipeline cannot start; anything unforeseen (a ``TypeError``
                from a model's metadata, a ``RecursionError``, a ``MemoryError``) comes as a
                ``PipelineBuildError`` naming it, so it is this pipeline's failure alone.
        """
        try:
            return self._build_pipeline(pc, config)
        except EdgeInferError:
            raise
        except Exception as exc:
            raise _unforeseen(pc.name, exc) from exc

    def _build_pipeline(self, pc: PipelineConfig, config: Config | None) -> Pipeline:
        stops = [p for p in pipeline_problems(config or self.config, pc) if p.stops]
        if stops:
            raise ConfigError("; ".join(str(p) for p in stops))
        effective = self.ota.effective(pc) if self.ota is not None else pc
        held = self._early.pop(pc.name, None)
        if held is not None and held[0] is not pc.source:
            discard(held[1])  # built for another config (a reload): not this one's
            held = None
        # a camera's capture process starts now, unless `edgeinfer run` started it already
        source = held[1] if held is not None else early_source(pc, **self.context)
        try:
            model = self._load_model(pc, effective)
        except BaseException:
            discard(source)
            raise
        try:
            seq = self.link.last_seq(pc.name) if self.link is not None else 0
            pipeline = assemble(pc, model, seq_start=seq,
                                state_dir=self.config.runtime.resolved_state_dir(),
                                where=pipeline_path(self.config, pc.name), source=source,
                                **self.context)
            pipeline.start()
        except BaseException:
            discard(source)
            model.close()
            raise
        health = pipeline.health()
        if health.ok:
            logger.info("pipeline %s running: %s on %s", pc.name, model.name, model.provider)
        elif health.state == "starting":  # a stream that opened, before its first frame
            logger.info("pipeline %s started (%s on %s), %s", pc.name, model.name,
                        model.provider, health.describe())
        else:  # a camera that is not there: the pipeline waits for it, and says so
            logger.warning("pipeline %s started (%s on %s) but is %s", pc.name, model.name,
                           model.provider, health.describe())
        return pipeline

    def _load_model(self, pc: PipelineConfig, effective: PipelineConfig) -> Model:
        """The model of ``effective`` (an OTA update's), or the configured one when it does not
        load."""
        try:
            return load_pipeline_model(effective, self.config.runtime)
        except Exception as exc:
            if effective is pc:
                raise
            logger.error("pipeline %s: the updated model %s does not load (%s); using the "
                         "configured %s", pc.name, effective.model.path, exc, pc.model.path)
            return load_pipeline_model(pc, self.config.runtime)

    def main_loop(self) -> None:
        next_stats = time.monotonic() + self.stats_interval_s
        while not self._stop.wait(TICK_S):
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._reload_from_signal()
            if self.link is not None:
                self.link.tick()
            if self.ota is not None:
                self.ota.tick()
            self._health_tick(time.monotonic())
            if all(p.join(0) for p in self.pipelines):
                break
            if self.stats_interval_s and time.monotonic() >= next_stats:
                next_stats += self.stats_interval_s
                for p in self.pipelines:
                    s = p.snapshot()
                    logger.info("%s: %.1f fps, %d results, %d dropped, infer p50 %.1f ms",
                                p.name, s["fps"], s["emitted"], s["dropped"]["queue"],
                                s["latency_ms"]["infer"]["p50"])
                if self.link is not None and self.link.plumbing is not None:
                    logger.info("%s", self.link.plumbing.describe())

    def shutdown(self) -> None:
        """Stop the sources, let queued frames finish, then flush the outbox to the broker (up
        to ``flush_timeout_s``) and publish the retained ``stopped`` status."""
        systemd.stopping()
        release(self._early)  # a startup that failed before every pipeline was built
        if self.ota is not None:  # an update in its health gate stays uncommitted: undone at boot
            self.ota.stop()
        if self.web is not None:
            self.web.stop()
        if self.metrics is not None:
            self.metrics.stop()
        for p in self.pipelines:
            p.stop()
        for p in self.pipelines:
            p.close()
        if self.link is not None:
            self.link.stop(self.flush_timeout_s)
        if self._state_lock is not None:
            self._state_lock.release()

    # -- the Host of the control plane: what the web view, commands and updates see ------------
    @property
    def device_id(self) -> str:
        return self.config.resolved_device_id()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held while the pipelines are replaced: a reload, a restart, a model swap."""
        with self._reload_lock:
            yield

    def announce(self) -> None:
        """Publish the retained birth again (the models changed: an update)."""
        if self.link is not None:
            self.link.publish_birth()

    def update_stats(self) -> dict[str, Any] | None:
        """The OTA agent's stats, or ``None`` without an ``ota:`` section."""
        return self.ota.stats() if self.ota is not None else None

    def status(self) -> dict[str, Any]:
        """What the ``status`` command answers: the birth plus the current stats (with the MQTT
        link's parts when there is one)."""
        if self.link is not None:
            return dict(self.link.status_message())
        return {**device_birth(self, self.device_id),
                "stats": device_stats(self, self.device_id, self._started)}

    def command(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        """Run command ``verb`` as the web view asks it: the MQTT commands' handlers and
        allow-list (``mqtt.commands``; every verb without an ``mqtt:`` section). Verbs that must
        be signed are refused here: a signature is checked on the MQTT path only.

        Raises:
            CommandError: an unknown, disallowed or signed-only verb, or a bad request.
        """
        publish = self.link.publish_snapshot if self.link is not None else None
        handlers = CommandHandlers(self, status=self.status, publish_snapshot=publish).table()
        return run_unsigned(handlers, command_policy(self.config.mqtt), verb, request)

    def reload(self) -> dict[str, Any]:
        """Re-read the config file; restart only the pipelines whose config changed. A model
        still used after the reload (same file and load options) is not loaded again.

        Everything new is built first: if the file is invalid or a changed pipeline cannot
        start, nothing running is touched and the error is raised.
        """
        if self.config_path is None:
            raise ConfigError("the daemon was not started from a config file; nothing to reload")
        systemd.reloading()
        try:
            return self._reload()
        finally:  # a refused reload keeps the old config running: ready again either way
            systemd.ready(self.status_line())

    def _reload(self) -> dict[str, Any]:
        assert self.config_path is not None
        # A pipeline rebuilt for a change elsewhere (sinks, source, task settings) gets the
        # model it ran back: the pool keeps it loaded until the end of the reload.
        with self._reload_lock, model_pool().hold():
            new = load_config(self.config_path)
            current = {p.name: p for p in self.pipelines}
            old_configs = {pc.name: pc for pc in self.config.pipelines}
            changed = [pc for pc in new.pipelines
                       if pc.name not in current or old_configs.get(pc.name) != pc]
            built: list[Pipeline] = []
            try:
                for pc in changed:
                    old = current.get(pc.name)
                    if old is not None:  # free its source (a camera opens once) first
                        old.close()
                    built.append(self._start_pipeline(pc, new))
            except EdgeInferError:
                for p in built:
                    p.close()
                raise
            keep = {pc.name for pc in new.pipelines}
            removed = [p for p in self.pipelines if p.name not in keep]
            for p in removed:
                p.close()
            rebuilt = {p.name for p in built}
            self.pipelines = [p for p in self.pipelines
                              if p.name in keep and p.name not in rebuilt] + built
            for name in rebuilt:  # a new config gets a fresh restart budget
                self.stalls.renewed(name)
            notes = []
            if new.mqtt != self.config.mqtt:
                notes.append("mqtt settings change on restart")
            if new.ota != self.config.ota:
                notes.append("ota settings change on restart")
            if new.http != self.config.http:
                notes.append("http settings change on restart")
            self.config = new
            return {"restarted": sorted(rebuilt), "removed": sorted(p.name for p in removed),
                    "unchanged": sorted(keep - rebuilt), "notes": notes}

    def stop(self) -> None:
        self._stop.set()

    def start_pipeline(self, name: str) -> Pipeline:
        """Start configured pipeline ``name`` that is not running (it failed at boot)."""
        pc = next((c for c in self.config.pipelines if c.name == name), None)
        if pc is None:
            raise ConfigError(f"pipeline {name} is not configured")
        pipeline = self._start_pipeline(pc)
        self.pipelines.append(pipeline)
        self.failed.pop(name, None)
        return pipeline

    def restart_pipeline(self, name: str) -> None:
        """Rebuild pipeline ``name`` from its config (and the OTA store); a failure is
        reported like a failed start."""
        with self._reload_lock:
            old = next((p for p in self.pipelines if p.name == name), None)
            if old is not None:
                old.close(RESTART_CLOSE_S)
                self.pipelines = [p for p in self.pipelines if p is not old]
            try:
                self.start_pipeline(name)
            except EdgeInferError as exc:
                self.failed[name] = str(exc)
                logger.error("pipeline %s not restarted: %s", name, exc)

    def _reload_from_signal(self) -> None:
        """SIGHUP: reload, and write the outcome where ``edgeinfer reload`` (the unit's
        ``ExecReload=``) waits for it."""
        self._reloads += 1
        try:
            result = self.reload()
        except EdgeInferError as exc:
            logger.error("reload refused, the running config is kept: %s", exc)
            self._record_reload(False, str(exc))
            return
        self._record_reload(True, f"restarted {', '.join(result['restarted']) or 'none'}")
        logger.info("reloaded: restarted %s, removed %s, unchanged %s",
                    result["restarted"] or "none", result["removed"] or "none",
                    result["unchanged"] or "none")

    def _record_reload(self, ok: bool, detail: str) -> None:
        path = result_path(self.config.runtime.resolved_state_dir())
        if path is None:
            return
        try:
            write_result(path, self._reloads, ok, detail)
        except OSError as exc:
            logger.warning("cannot write the reload outcome to %s: %s", path, exc)

    def summary(self) -> list[dict[str, Any]]:
        return [dict(p.snapshot(), restarts=self.restarts.get(p.name, 0))
                for p in self.pipelines]

    # -- health, watchdog, status ---------------------------------------------------------------
    def status_line(self) -> str:
        """What ``STATUS=`` says: ``2 pipelines, 14.8 fps, outbox 0``, led by each pipeline that
        is not running and why (``cam no_source: no such device /dev/video9: ...; 3 retries,
        next in 2 s``) and by one that is stuck."""
        fps = sum(self._recent_fps(p) for p in self.pipelines)
        n = len(self.pipelines)
        text = f"{n} pipeline{'s' if n != 1 else ''}, {fps:.1f} fps"
        if self.link is not None and self.link.plumbing is not None:
            text += f", {self.link.plumbing.describe()}"
        now = time.monotonic()
        failing = [p.name for p in self.pipelines if self.stalls.sinks_failing(p, now)]
        if failing:
            text += f", sinks failing in {', '.join(failing)}"
        restarts = sum(self.restarts.values())
        if restarts:
            text += f", {restarts} restart{'s' if restarts != 1 else ''}"
        unwell = [f"{p.name} {h.describe()}" for p in self.pipelines
                  if not (h := p.health()).ok and h.state != "done"]
        if unwell:
            text = "; ".join(unwell) + "; " + text
        if self.stuck is not None:
            text = f"pipeline {self.stuck} stuck (restart budget spent); " + text
        problem = self.link.problem() if self.link is not None else None
        if problem is not None:
            text = f"{problem}; " + text
        return text

    def _recent_fps(self, p: Pipeline) -> float:
        now, n = time.monotonic(), p.stats.processed
        mark = self._rate_mark.get(p.name)
        self._rate_mark[p.name] = (p, n, now)
        if mark is None or mark[0] is not p or now <= mark[2]:
            return p.stats.overall_fps()
        return (n - mark[1]) / (now - mark[2])

    def _health_tick(self, now: float) -> None:
        for p in list(self.pipelines):
            why = self.stalls.due(p, now)
            if why is not None:
                self._on_stall(p, now, why)
        healthy = self.stuck is None and (self.link is None or self.link.problem() is None)
        if self.watchdog_s and healthy and now >= self._next_ping:
            self._next_ping = now + self.watchdog_s / 2
            systemd.watchdog()
        if now >= self._next_status:
            self._next_status = now + STATUS_INTERVAL_S
            systemd.status(self.status_line())

    def _on_stall(self, p: Pipeline, now: float, why: str) -> None:
        """Rebuild stuck pipeline ``p`` within the restart budget, or give up on it."""
        if not self.stalls.admit(p.name, now, why):
            systemd.status(self.status_line())
            return
        with self._reload_lock:
            if p not in self.pipelines:  # a reload replaced it meanwhile
                return
            pc = next((c for c in self.config.pipelines if c.name == p.name), None)
            p.close(RESTART_CLOSE_S)
            try:
                if pc is None:
                    raise ConfigError(f"pipeline {p.name} is no longer configured")
                new = self._start_pipeline(pc)
            except EdgeInferError as exc:
                self.stalls.give_up(p.name, f"restart failed: {exc}")
                systemd.status(self.status_line())
                return
            self.pipelines = [new if q is p else q for q in self.pipelines]
        self.stalls.restarted(p.name)

    # -- signals --------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # run() from a thread (tests, embedding): the caller stops us
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGHUP, lambda *_: self._reload_requested.set())

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(EXIT_FORCED)  # the user insists: do not wait for a stuck stage
        self._stop.set()


def _unforeseen(name: str, exc: BaseException) -> PipelineBuildError:
    """``exc``, raised building pipeline ``name``, as its typed failure (logged with the
    traceback: it is a case no check foresaw)."""
    logger.error("pipeline %s: building it raised %s", name, type(exc).__name__, exc_info=exc)
    detail = str(exc)
    if len(detail) > 300:
        detail = detail[:300] + "..."
    return PipelineBuildError(f"pipeline {name} could not be built: {type(exc).__name__}"
                              f"{': ' + detail if detail else ''} (most often a model file "
                              "whose metadata or shapes nothing reads; check the model with "
                              "edgeinfer info)")
