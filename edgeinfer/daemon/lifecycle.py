"""``edgeinfer run``: startup -> tick loop -> graceful shutdown. Signals only set flags.

Startup loads every pipeline's model, checks it against its task, opens sinks and sources and
starts the stage threads. A pipeline that fails to start is reported and left out, unless it
is ``required`` (then the daemon fails). The tick loop ends when every pipeline has finished
(file sources end) or on SIGINT/SIGTERM; a second signal forces an immediate exit.

Under systemd the daemon speaks sd_notify (``edgeinfer.systemd``): ``READY=1`` once every
pipeline runs, ``STATUS=`` every few seconds, ``RELOADING=1``/``READY=1`` around a reload,
``STOPPING=1`` at shutdown, and ``WATCHDOG=1`` only while every pipeline is healthy and the
command thread runs. A live
pipeline that processes no frame for ``stall_s`` is rebuilt from its config, at most
``RESTART_BUDGET`` times in the restart window; then the pings stop and systemd kills and
restarts us. `stall_policy` keeps the two consistent: the window always holds a full budget of
stalls, so a hung pipeline is escalated whatever ``WatchdogSec=`` is. A sensor source (``mqtt``,
``serial``: `Source.paced_by_data`) may be quiet for hours: it stalls only when a frame it
yielded goes unhandled for ``stall_s``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import deque
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import systemd
from .errors import ConfigError, EdgeInferError

if TYPE_CHECKING:
    from .config import Config
    from .pipeline import Pipeline

logger = logging.getLogger(__name__)

TICK_S = 0.5
EXIT_FORCED = 130
STATUS_INTERVAL_S = 5.0  # how often STATUS= is refreshed
MIN_STALL_S = 10.0  # a live pipeline silent this long (or one watchdog interval) is stuck
RESTART_BUDGET = 5  # internal restarts of one stuck pipeline ...
RESTART_WINDOW_S = 60.0  # ... within at least this window, before the watchdog pings stop
RESTART_CLOSE_S = 5.0  # how long a stuck pipeline's stages get to finish when restarted


def stall_policy(watchdog_s: float | None, stall_s: float | None = None,
                 restart_budget: int = RESTART_BUDGET,
                 restart_window_s: float | None = None) -> tuple[float, float]:
    """The stall deadline and the restart window, made consistent.

    The deadline defaults to ``max(MIN_STALL_S, watchdog_s)``. The window defaults to room for
    the whole budget with slack: ``2 x budget x (stall_s + RESTART_CLOSE_S)``, at least
    ``RESTART_WINDOW_S``. A window shorter than ``budget x stall_s`` could never fill (one stall
    takes ``stall_s`` to notice), so the pipeline would be rebuilt forever and never escalated
    to the service manager: such a window is raised to that default.
    """
    stall = stall_s or max(MIN_STALL_S, watchdog_s or 0.0)
    needed = 2 * restart_budget * (stall + RESTART_CLOSE_S)
    window = max(RESTART_WINDOW_S, needed)
    if restart_window_s is not None and restart_window_s > restart_budget * stall:
        window = restart_window_s
    elif restart_window_s is not None:
        logger.warning("restart window %g s cannot hold %d stalls of %g s: using %g s",
                       restart_window_s, restart_budget, stall, window)
    return stall, window


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
            (see `stall_policy`).
    """

    def __init__(self, config: Config, *, config_path: str | None = None,
                 stats_interval_s: float = 0.0, flush_timeout_s: float = 5.0,
                 stall_s: float | None = None, restart_budget: int = RESTART_BUDGET,
                 restart_window_s: float | None = None, **context: Any) -> None:
        self.config = config
        self.config_path = config_path
        self.context = context
        self.stats_interval_s = stats_interval_s
        self.flush_timeout_s = flush_timeout_s
        self.pipelines: list[Pipeline] = []
        self.failed: dict[str, str] = {}
        self.link: Any = None  # control.link.MqttLink when the config has an mqtt: section
        self.metrics: Any = None  # control.metrics.MetricsServer when metrics: is enabled
        self.ota: Any = None  # ota.agent.OtaAgent when the config has an ota: section
        self.web: Any = None  # web.WebServer when the config has an http: section
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
        self.restarts: dict[str, int] = {}  # internal restarts of stuck pipelines, per name
        self.stuck: str | None = None  # a pipeline whose restart budget is spent
        self._restart_times: dict[str, deque[float]] = {}
        self._progress: dict[str, tuple[Pipeline, int, float]] = {}  # processed, when it moved
        self._rate_mark: dict[str, tuple[Pipeline, int, float]] = {}
        self._next_ping = 0.0
        self._next_status = 0.0
        self._state_lock: Any = None  # statelock.StateLock held from startup to shutdown

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
        from .runtime.memory import return_frames_to_the_os, set_memory_budget
        from .statelock import LOCK_NAME, StateLock

        # One daemon per state directory (outbox, model store, probe decisions): a second one
        # refuses here with AlreadyRunningError naming the first.
        self._state_lock = StateLock(self.config.runtime.resolved_state_dir() / LOCK_NAME)
        self._state_lock.acquire()
        set_memory_budget(self.config.runtime.memory_budget_mb)
        return_frames_to_the_os()
        if self.config.mqtt is not None:
            from .control.link import MqttLink

            self.link = MqttLink(self.config, self)
            self.link.start()  # before the pipelines: MQTT sources subscribe through it
            for key, value in self.link.context().items():
                self.context.setdefault(key, value)
        if self.config.ota is not None:
            from .ota.agent import OtaAgent

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
        if not self.pipelines:
            reasons = "; ".join(f"{k}: {v}" for k, v in self.failed.items()) or "none configured"
            raise ConfigError(f"no pipeline could start ({reasons})")
        if self.link is not None:
            self.link.ready()
            if self.ota is not None:
                self.ota.start(self.link.plumbing.client)
        if self.config.metrics is not None and self.config.metrics.enabled:
            from .control.metrics import MetricsServer

            self.metrics = MetricsServer(self, self.config.metrics)
            self.metrics.start()
        if self.config.http is not None:
            from .web import WebServer

            self.web = WebServer(self.config.http, self)
            self.web.start()
            logger.info("web view on %s", self.web.url)
        systemd.ready(self.status_line())

    def _start_pipeline(self, pc: Any) -> Pipeline:
        """Load, assemble and start one pipeline; nothing is left open if it fails. A model
        installed by an update (the OTA store's ``current``) replaces the configured one; if it
        cannot load, the configured model is used."""
        from .assembly import assemble, load_pipeline_model, pipeline_path

        effective = self.ota.effective(pc) if self.ota is not None else pc
        try:
            model = load_pipeline_model(effective, self.config.runtime)
        except EdgeInferError as exc:
            if effective is pc:
                raise
            logger.error("pipeline %s: the updated model %s does not load (%s); using the "
                         "configured %s", pc.name, effective.model.path, exc, pc.model.path)
            model = load_pipeline_model(pc, self.config.runtime)
        try:
            seq = self.link.last_seq(pc.name) if self.link is not None else 0
            pipeline = assemble(pc, model, seq_start=seq,
                                state_dir=self.config.runtime.resolved_state_dir(),
                                where=pipeline_path(self.config, pc.name), **self.context)
            pipeline.start()
        except BaseException:
            model.close()
            raise
        health = pipeline.health()
        if health.ok:
            logger.info("pipeline %s running: %s on %s", pc.name, model.name, model.provider)
        else:  # a camera that is not there: the pipeline waits for it, and says so
            logger.warning("pipeline %s started (%s on %s) but is %s", pc.name, model.name,
                           model.provider, health.describe())
        return pipeline

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

    # -- what the web view and command handlers see -----------------------------------------
    @property
    def device_id(self) -> str:
        return self.config.resolved_device_id()

    def status(self) -> dict[str, Any]:
        """What the ``status`` command answers: the birth plus the current stats (with the MQTT
        link's parts when there is one)."""
        if self.link is not None:
            return dict(self.link.status_message())
        from .control.status import device_birth, device_stats

        return {**device_birth(self, self.device_id),
                "stats": device_stats(self, self.device_id, self._started)}

    def command(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        """Run command ``verb`` as the web view asks it: the MQTT commands' handlers and
        allow-list (``mqtt.commands``; every verb without an ``mqtt:`` section). Verbs that must
        be signed are refused here: a signature is checked on the MQTT path only.

        Raises:
            CommandError: an unknown, disallowed or signed-only verb, or a bad request.
        """
        from .config.commands import VERBS, CommandsConfig
        from .control.commands import CommandError
        from .control.handlers import CommandHandlers

        policy = self.config.mqtt.commands if self.config.mqtt is not None else True
        allow = VERBS if policy is True else () if policy is False else tuple(policy.allow)
        signed = policy.signed if isinstance(policy, CommandsConfig) else []
        if verb not in VERBS:
            raise CommandError(f"unknown command {verb!r}; valid: {', '.join(VERBS)}")
        if verb not in allow:
            raise CommandError(f"command {verb!r} is not allowed on this device "
                               f"(mqtt.commands.allow: {', '.join(allow) or 'none'})")
        if verb in signed:
            raise CommandError(f"command {verb!r} must be signed on this device "
                               "(mqtt.commands.signed): send it over MQTT")
        publish = self.link._publish_snapshot if self.link is not None else None
        handlers = CommandHandlers(self, status=self.status, publish_snapshot=publish).table()
        return handlers[verb](dict(request))

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
        from .config import load_config
        from .sharing import model_pool

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
                    built.append(self._start_pipeline(pc))
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
                self._restart_times.pop(name, None)
                if self.stuck == name:
                    self.stuck = None
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
        from .reload import result_path, write_result

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
        failing = [p.name for p in self.pipelines if self._sinks_failing(p, now)]
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
            if self.stuck is None and self._stalled(p, now):
                self._on_stall(p, now)
            elif self.stuck is None and self._sinks_failing(p, now) > self.stall_s \
                    and p.source.live and not p.paused and not p.join(0):
                # a file pipeline would read its file again: it only shows as unhealthy
                self._on_stall(p, now, f"its sinks failed every result for {self.stall_s:g} s")
        healthy = self.stuck is None and (self.link is None or self.link.problem() is None)
        if self.watchdog_s and healthy and now >= self._next_ping:
            self._next_ping = now + self.watchdog_s / 2
            systemd.watchdog()
        if now >= self._next_status:
            self._next_status = now + STATUS_INTERVAL_S
            systemd.status(self.status_line())

    def _stalled(self, p: Pipeline, now: float) -> bool:
        """A live, unpaused, unfinished pipeline whose processed count has not moved for
        ``stall_s``. A file source that ended is not a stall, nor a camera that cannot be opened
        (unplugged: it retries with backoff and shows on stats; restarting the service would
        not bring it back), nor a quiet sensor: a source `paced_by_data` owes progress only
        while a frame it yielded is in flight, and any handling of a frame (processed, dropped
        by the task or the queue, skipped, failed) is progress."""
        src, stats = p.source, p.stats
        n = stats.processed
        idle = False
        if getattr(src, "paced_by_data", False):
            n += stats.dropped_by_task + stats.dropped_queue + stats.errors + stats.paused
            idle = src.stats.frames <= n  # nothing yielded waits: a quiet sensor
        mark = self._progress.get(p.name)
        if not src.live or p.paused or p.join(0) or src.waiting or idle or mark is None \
                or mark[0] is not p or mark[1] != n:
            self._progress[p.name] = (p, n, now)
            return False
        return now - mark[2] > self.stall_s

    @staticmethod
    def _sinks_failing(p: Pipeline, now: float) -> float:
        """How long a sink of ``p`` has failed every write (0.0: all working); such a pipeline
        is unhealthy, and is restarted like a stuck one when it lasts ``stall_s``."""
        since = [s.failing_since for s in p.sinks if s.failing_since]
        return now - min(since) if since else 0.0

    def _on_stall(self, p: Pipeline, now: float, why: str | None = None) -> None:
        times = self._restart_times.setdefault(p.name, deque())
        while times and now - times[0] > self.restart_window_s:
            times.popleft()
        if len(times) >= self.restart_budget:
            self._give_up(p.name, f"{len(times)} restarts in {self.restart_window_s:.0f} s")
            return
        times.append(now)
        self.restarts[p.name] = self.restarts.get(p.name, 0) + 1
        logger.warning("pipeline %s: %s; restarting it (%d of %d in %.0f s)", p.name,
                       why or f"no frame processed for {self.stall_s:g} s", len(times),
                       self.restart_budget, self.restart_window_s)
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
                self._give_up(p.name, f"restart failed: {exc}")
                return
            self.pipelines = [new if q is p else q for q in self.pipelines]
        self._progress.pop(p.name, None)

    def _give_up(self, name: str, why: str) -> None:
        self.stuck = name
        logger.error("pipeline %s is stuck (%s); watchdog pings stop so that the service "
                     "manager restarts the daemon", name, why)
        systemd.status(self.status_line())

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
