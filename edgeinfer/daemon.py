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

    def __init__(self, config: Config, *, stats_interval_s: float = 0.0, **context: Any) -> None:
        self.config = config
        self.context = context
        self.stats_interval_s = stats_interval_s
        self.pipelines: list[Pipeline] = []
        self.failed: dict[str, str] = {}
        self._stop = threading.Event()
        self._signals = 0

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
        from .assembly import assemble, load_pipeline_model
        from .runtime.memory import set_memory_budget

        set_memory_budget(self.config.runtime.memory_budget_mb)
        for pc in self.config.pipelines:
            model = None
            try:
                model = load_pipeline_model(pc, self.config.runtime)
                pipeline = assemble(pc, model, **self.context)
                pipeline.start()
            except EdgeInferError as exc:
                if model is not None:
                    model.close()
                if pc.required:
                    raise
                self.failed[pc.name] = str(exc)
                logger.error("pipeline %s not started: %s", pc.name, exc)
                continue
            self.pipelines.append(pipeline)
            logger.info("pipeline %s running: %s on %s", pc.name, pipeline.model.name,
                        pipeline.model.provider)
        if not self.pipelines:
            reasons = "; ".join(f"{k}: {v}" for k, v in self.failed.items()) or "none configured"
            raise ConfigError(f"no pipeline could start ({reasons})")

    def main_loop(self) -> None:
        next_stats = time.monotonic() + self.stats_interval_s
        while not self._stop.wait(TICK_S):
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
        for p in self.pipelines:
            p.stop()
        for p in self.pipelines:
            p.close()

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> list[dict[str, Any]]:
        return [p.snapshot() for p in self.pipelines]

    # -- signals --------------------------------------------------------------------------------
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # run() from a thread (tests, embedding): the caller stops us
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(EXIT_FORCED)  # the user insists: do not wait for a stuck stage
        self._stop.set()
