"""``edgeinfer run``: startup -> tick loop -> graceful shutdown. Signals only set flags.

Startup loads every pipeline's model, checks it against its task, opens sinks and sources and
starts the stage threads. A pipeline that fails to start is reported and left out, unless it
is ``required`` (then the daemon fails). The tick loop ends when every pipeline has finished
(file sources end) or on SIGINT/SIGTERM; a second signal forces an immediate exit.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, EdgeInferError

if TYPE_CHECKING:
    from .config import Config
    from .pipeline import Pipeline

logger = logging.getLogger(__name__)

TICK_S = 0.5
EXIT_FORCED = 130


class Daemon:
    """Runs the pipelines of one config until they end or a signal arrives.

    Args:
        config: The validated config.
        context: Passed to every source and sink (e.g. an MQTT ``subscribe``).
        stats_interval_s: How often the tick logs a stats line (0: never).
    """

    def __init__(self, config: Config, *, config_path: str | None = None,
                 stats_interval_s: float = 0.0, flush_timeout_s: float = 5.0,
                 **context: Any) -> None:
        self.config = config
        self.config_path = config_path
        self.context = context
        self.stats_interval_s = stats_interval_s
        self.flush_timeout_s = flush_timeout_s
        self.pipelines: list[Pipeline] = []
        self.failed: dict[str, str] = {}
        self.link: Any = None  # control.link.MqttLink when the config has an mqtt: section
        self._stop = threading.Event()
        self._signals = 0
        self._reload_lock = threading.Lock()
        self._reload_requested = threading.Event()

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
        from .runtime.memory import set_memory_budget

        set_memory_budget(self.config.runtime.memory_budget_mb)
        if self.config.mqtt is not None:
            from .control.link import MqttLink

            self.link = MqttLink(self.config, self)
            self.link.start()  # before the pipelines: MQTT sources subscribe through it
            for key, value in self.link.context().items():
                self.context.setdefault(key, value)
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

    def _start_pipeline(self, pc: Any) -> Pipeline:
        """Load, assemble and start one pipeline; nothing is left open if it fails."""
        from .assembly import assemble, load_pipeline_model

        model = load_pipeline_model(pc, self.config.runtime)
        try:
            seq = self.link.last_seq(pc.name) if self.link is not None else 0
            pipeline = assemble(pc, model, seq_start=seq, **self.context)
            pipeline.start()
        except BaseException:
            model.close()
            raise
        logger.info("pipeline %s running: %s on %s", pc.name, model.name, model.provider)
        return pipeline

    def main_loop(self) -> None:
        next_stats = time.monotonic() + self.stats_interval_s
        while not self._stop.wait(TICK_S):
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._reload_from_signal()
            if self.link is not None:
                self.link.tick()
            if all(p.join(0) for p in self.pipelines):
                break
            if self.stats_interval_s and time.monotonic() >= next_stats:
                next_stats += self.stats_interval_s
                for p in self.pipelines:
                    s = p.snapshot()
                    logger.info("%s: %.1f fps, %d results, %d dropped, infer p50 %.1f ms",
                                p.name, s["fps"], s["emitted"], s["dropped"]["queue"],
                                s["latency_ms"]["infer"]["p50"])

    def shutdown(self) -> None:
        """Stop the sources, let queued frames finish, then flush the outbox to the broker (up
        to ``flush_timeout_s``) and publish the retained ``stopped`` status."""
        for p in self.pipelines:
            p.stop()
        for p in self.pipelines:
            p.close()
        if self.link is not None:
            self.link.stop(self.flush_timeout_s)

    def reload(self) -> dict[str, Any]:
        """Re-read the config file; restart only the pipelines whose config changed.

        Everything new is built first: if the file is invalid or a changed pipeline cannot
        start, nothing running is touched and the error is raised.
        """
        from .config import load_config

        if self.config_path is None:
            raise ConfigError("the daemon was not started from a config file; nothing to reload")
        with self._reload_lock:
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
            notes = []
            if new.mqtt != self.config.mqtt:
                notes.append("mqtt settings change on restart")
            self.config = new
            return {"restarted": sorted(rebuilt), "removed": sorted(p.name for p in removed),
                    "unchanged": sorted(keep - rebuilt), "notes": notes}

    def stop(self) -> None:
        self._stop.set()

    def _reload_from_signal(self) -> None:
        try:
            result = self.reload()
        except EdgeInferError as exc:
            logger.error("reload refused, the running config is kept: %s", exc)
            return
        logger.info("reloaded: restarted %s, removed %s, unchanged %s",
                    result["restarted"] or "none", result["removed"] or "none",
                    result["unchanged"] or "none")

    def summary(self) -> list[dict[str, Any]]:
        return [p.snapshot() for p in self.pipelines]

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
