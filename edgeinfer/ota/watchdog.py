"""The trial run's time limit and failure mapping (``verify.trial_run``): a watchdog thread
that kills the trial's workers once ``timeout_s`` has passed, and the status reason for an
error the load or a run raised."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING

from ..errors import (
    EdgeInferError,
    InvalidInputError,
    ModelMemoryError,
    ModelTooLargeError,
    OtaRejected,
    UnsafeModelError,
    WorkerCrashedError,
)

if TYPE_CHECKING:
    from ..model.model import Model

__all__ = ["TrialWatchdog", "rejection_for"]

logger = logging.getLogger(__name__)

# How native code that ignores a failed allocation under RLIMIT_AS usually dies (worker.py).
_ALLOC_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS")


def rejection_for(exc: EdgeInferError, watchdog: TrialWatchdog,
               memory_limit_mb: float | None) -> OtaRejected:
    """The status reason for an error the load or a run raised."""
    if watchdog.fired:
        return watchdog.rejection()
    text = str(exc)
    if isinstance(exc, ModelMemoryError):
        return OtaRejected("out_of_memory", text)
    if isinstance(exc, WorkerCrashedError):
        if " timed out after " in text:  # WorkerSession's own start timeout
            return OtaRejected("timeout", text)
        if memory_limit_mb is not None and any(s in text for s in _ALLOC_SIGNALS):
            return OtaRejected("out_of_memory", text)
        return OtaRejected("worker_crashed", text)
    if isinstance(exc, ModelTooLargeError):
        return OtaRejected("oversize", text)
    if isinstance(exc, UnsafeModelError):
        return OtaRejected("unsafe_model", text)
    if isinstance(exc, InvalidInputError):
        return OtaRejected("undecodable", text)
    # ModelLoadError, ModelFormatError, ProviderError, a ConfigError of the options (an
    # input_shapes entry the model has no input for), an InferenceError of the warm-up.
    return OtaRejected("load_failed", f"{type(exc).__name__}: {text}")


class TrialWatchdog:
    """Kills the trial's worker once ``timeout_s`` has passed. The load itself is bounded by the
    worker's own start timeout (``load_model(worker_timeout_s=...)``); this covers the runs and
    the work between them."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.models: list[Model] = []  # whose workers a timeout kills
        self.fired = False
        self._done = threading.Event()
        self._deadline = 0.0
        self._thread: threading.Thread | None = None

    def __enter__(self) -> TrialWatchdog:
        self._deadline = time.monotonic() + self.timeout_s
        self._thread = threading.Thread(target=self._watch, name="ota-verify-watchdog",
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def remaining(self) -> float:
        return self._deadline - time.monotonic()

    def check(self) -> None:
        """Raise ``timeout`` once the deadline has passed (for work done outside the worker)."""
        if self.fired or time.monotonic() > self._deadline:
            self.fired = True
            raise self.rejection()

    def rejection(self) -> OtaRejected:
        return OtaRejected("timeout", f"the trial run took longer than {self.timeout_s:g} s "
                                      "(loading and runs); the worker was killed")

    def _watch(self) -> None:
        if self._done.wait(max(0.0, self._deadline - time.monotonic())):
            return
        self.fired = True
        logger.warning("trial run past %g s: killing its workers", self.timeout_s)
        while True:  # until the trial notices (a load still under way ends by its own timeout)
            for model in list(self.models):
                pid = model.worker_pid
                if pid is not None:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            if self._done.wait(0.05):
                return
