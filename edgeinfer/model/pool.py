"""One loaded model per distinct file and load options in the process, shared by the pipelines
that name it.

Four cameras on one detector used to mean four sessions, four arenas and four thread pools.
`ModelPool.acquire` keys a load by the file's sha256 and every load option (threads,
providers, input shapes, isolation, ...; not the name, the version or the size limit, which do
not change the session): the first pipeline loads the model, the next get a `SharedModel`
handle on the same `Model`, reference-counted, and the last handle closed closes it.

A handle is a `Model` to its pipeline (tasks, OTA, stats read it as one) with its own name,
version and stats. Its ``run`` goes through the entry's scheduler: with one user it runs in
the caller's thread; with several, one inference thread serves them round-robin over the
handles that have a frame waiting, so a camera flooding the model cannot starve a slow one
(a lock would be first come, first served). What waits is at most one frame per pipeline: each
pipeline's infer stage submits one and waits, and frames piling up behind it are dropped by
its own capture queue and counted there. Errors go back to the pipeline whose frame raised.

Where the model takes a batch and batching measured faster on its backend (``model.batch``,
``model/batching.py``), the inference thread (``model/scheduler.py``) runs the frames waiting
from several sharers as one batch and hands each pipeline its row; otherwise, and until
measured, round-robin.

A worker process that dies (``isolation: process``) costs the frame that was in flight: its
pipeline gets ``WorkerCrashedError`` and counts it; the inference thread starts a fresh worker
before serving anyone else, so the other pipelines' frames wait for the restart and are then
served. A restart that fails leaves the worker dead: every sharer's next frame fails and its
own ``restart()`` tries again, as an unshared pipeline does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ModelMemoryError, StateError, WorkerCrashedError
from ..runtime.batching import BatchPolicy
from .batching import Batcher
from .load import DEFAULT_MAX_MODEL_MB, load_model
from .model import Model
from .scheduler import Request, Scheduler

if TYPE_CHECKING:
    import numpy as np

    from ..runtime.base import Session

logger = logging.getLogger("edgeinfer.sharing")  # the name before the move

# Options that do not change the loaded session: identity, and a size limit each requester
# checks for itself.
_NOT_KEYED = ("name", "version", "max_model_mb")


class SharedModel(Model):
    """One pipeline's handle on a pooled `Model`: everything reads through to it, except the
    name and version (the pipeline's own), ``run`` (scheduled), ``restart`` (once per crash for
    all sharers) and ``close`` (this handle only; the last one closes the model).

    Attributes:
        owner: The pipeline using this handle (set by the pipeline), for stats.
        runs: Runs of this handle.
        last_wait_ms: How long the last run waited for the model (other pipelines' runs).
        max_waited_runs: The most runs of other handles one run of this one waited for; with
            every sharer flooding, round-robin keeps it at most sharers - 1.
    """

    def __init__(self, entry: _Entry, name: str, version: str | None) -> None:
        # No Model.__init__: attributes not set here are the shared model's (`__getattr__`),
        # read live, so a session the model swaps in is seen by every handle.
        self._shared_entry = entry
        self._shared_released = False
        self._shared_crash_gen: int | None = None
        self._shared_lock = threading.Lock()  # one call of this handle at a time
        self.name = name
        self.version = version
        self.owner = ""
        self.runs = 0
        self.last_wait_ms = 0.0
        self.max_waited_runs = 0

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_shared_"):  # not set yet (half built): no recursion
            raise AttributeError(attr)
        return getattr(self._shared_entry.model, attr)

    @property
    def shared(self) -> Model:
        """The pooled model behind this handle."""
        return self._shared_entry.model

    @property
    def closed(self) -> bool:
        return self._shared_released or self._shared_entry.model.closed

    def _live(self) -> Session:
        if self._shared_released:
            raise StateError(f"model {self.name!r} is closed")
        return super()._live()

    def run(self, inputs: Mapping[str, Any] | np.ndarray) -> dict[str, np.ndarray]:
        """`Model.run`, scheduled with the other pipelines sharing the model."""
        with self._shared_lock:
            if self._shared_released:
                raise StateError(f"model {self.name!r} is closed")
            return self._shared_entry.submit(self, inputs)

    def another(self, owner: str) -> SharedModel:
        """A second handle on the same pooled model, scheduled with the others (the web view's
        ``POST /v1/infer`` runs the pipeline's model through one, never racing the pipeline).
        ``close()`` it when done."""
        handle = SharedModel(self._shared_entry, self.name, self.version)
        handle.owner = owner
        self._shared_entry.attach(handle)
        return handle

    def select_backend(self, gate: Any = None, *, background: bool = False,
                       budget_s: float | None = None) -> Any:
        """`Model.select_backend` of the pooled model: the winner serves every sharer. (Not
        inherited: Model's would set the new session on this handle, not on the model.)"""
        return self._shared_entry.model.select_backend(gate, background=background,
                                                       budget_s=budget_s)

    def restart(self) -> None:
        """Revive a crashed worker; nothing if the model's own inference thread already did
        after the crash this handle saw."""
        self._live()
        self._shared_entry.restart(self)

    def close(self) -> None:
        """Give this handle back; the last one closes the model. Idempotent."""
        if not self._shared_released:
            self._shared_released = True
            self._shared_entry.pool.release(self)

    def sharers(self) -> list[str]:
        """The pipelines using the model (this one included), in the order they came."""
        return self._shared_entry.owners()

    def shared_stats(self) -> dict[str, Any]:
        """What the pipeline's stats say about the sharing."""
        e = self._shared_entry
        return {"pipelines": e.owners(), "runs": self.runs, "model_runs": e.runs,
                "max_waited_runs": self.max_waited_runs, "worker_restarts": e.restarts,
                "batch": e.batcher.stats()}


class _Entry(Scheduler[SharedModel]):
    """A pooled model, its users and its inference thread (``model/scheduler.py``)."""

    def __init__(self, pool: ModelPool, key: tuple[str, str], model: Model,
                 policy: BatchPolicy) -> None:
        super().__init__(Batcher(model, policy), f"edgeinfer-model-{model.name}")
        self.pool, self.key, self.model = pool, key, model
        self.restarts = 0
        self.generation = 0  # worker restarts so far, to restart once per crash

    def owners(self) -> list[str]:
        with self.cond:
            return [c.owner or c.name for c in self.clients]

    # -- running --------------------------------------------------------------------------------
    def submit(self, client: SharedModel, inputs: Any) -> dict[str, np.ndarray]:
        with self.cond:
            if self.stopping:
                raise StateError(f"model {client.name!r} is closed")
            request = Request(inputs, time.perf_counter(), self.runs)
            queued = len(self.clients) > 1
            if queued:
                self.enqueue(client, request)
        if queued:
            request.done.wait()
        else:
            with self.run_lock:  # alone: in the caller's thread, no hand-over
                self.execute(client, request)
        if request.error is not None:
            if isinstance(request.error, WorkerCrashedError):
                client._shared_crash_gen = request.crash_gen
            raise request.error
        assert request.outputs is not None
        return request.outputs

    def execute(self, client: SharedModel, request: Request) -> None:
        """Run one request (holding the run lock)."""
        self.started(client, request)
        try:
            request.outputs = self.model.run(request.feeds)
        except WorkerCrashedError as exc:
            request.error, request.crash_gen = exc, self.generation
            self._revive(exc)
        except BaseException as exc:  # every error goes back to the pipeline that asked
            request.error = exc
        finally:
            self.runs += 1
            client.runs += 1
            request.done.set()

    def _revive(self, exc: WorkerCrashedError) -> None:
        """Start a fresh worker before serving anyone else."""
        logger.warning("model %s: %s; restarting the worker shared by %s", self.model.name,
                       exc, ", ".join(self.owners()))
        try:
            self.model.restart()
        except Exception as err:  # each sharer's next run fails and its restart() retries
            logger.error("model %s: the worker did not restart: %s", self.model.name, err)
            return
        self.restarts += 1
        self.generation += 1

    def restart(self, client: SharedModel) -> None:
        with self.run_lock:
            seen = client._shared_crash_gen
            client._shared_crash_gen = None
            if seen is not None and self.generation > seen:
                return  # revived after the crash this client saw
            self.model.restart()
            self.restarts += 1
            self.generation += 1

    # -- users ----------------------------------------------------------------------------------
    def attach(self, client: SharedModel) -> None:
        with self.cond:
            self.clients.append(client)

    def detach(self, client: SharedModel) -> int:
        """Remove ``client`` (its waiting request fails); the number of clients left."""
        with self.cond:
            self.clients.remove(client)
            request = self.withdraw(client)
            if request is not None:
                request.error = StateError(f"model {client.name!r} is closed")
                request.done.set()
            return len(self.clients)

    def close(self, timeout: float = 5.0) -> None:
        self.stop(timeout)
        self.model.close()


class ModelPool:
    """The process's loaded models, shared by key; see the module's docstring.

    Attributes:
        enabled: ``False`` loads a model per acquire, as before sharing (benchmarks compare).
    """

    def __init__(self) -> None:
        self.enabled = True
        self._lock = threading.Lock()  # the entries
        self._load_lock = threading.Lock()  # one load at a time: a second asker waits for it
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._holds = 0
        self._idle: list[_Entry] = []  # unused while held, closed when the hold ends

    def acquire(self, path: str | Path, batch: BatchPolicy | None = None, **options: Any
                ) -> Model:
        """A model for ``load_model(path, **options)``: the loaded one with the same file and
        options (a `SharedModel` handle), else a new load. ``batch`` says whether its sharers'
        frames may run as one batch (default: ``auto``, measured); it is part of the key.

        Raises:
            What ``load_model`` raises; the requester's ``max_model_mb`` is checked also when
            the model is already loaded.
        """
        if not self.enabled:
            return load_model(path, **options)
        from .catalog import resolve_model
        from ..runtime.modelfile import inspect_model

        name, version = options.get("name"), options.get("version")
        limit = options.get("max_model_mb")
        info = inspect_model(resolve_model(path),
                             max_model_mb=DEFAULT_MAX_MODEL_MB if limit is None else limit)
        policy = batch or BatchPolicy()
        key = (info.sha256, _options_key(options, policy))
        handle = self._attach(key, name or info.path.stem, version)
        if handle is not None:
            return handle
        with self._load_lock:
            handle = self._attach(key, name or info.path.stem, version)  # loaded meanwhile
            if handle is not None:
                return handle
            model = self._load(path, options)
            entry = _Entry(self, key, model, policy)
            handle = SharedModel(entry, model.name, model.version)
            entry.attach(handle)
            with self._lock:
                self._entries[key] = entry
        return handle

    def adopt(self, model: Model, batch: BatchPolicy | None = None) -> SharedModel:
        """Share a model the caller loaded itself (e.g. on one exact backend configuration,
        ``load.open_model``): a handle scheduled like an acquired one; more handles come from
        its ``another()``. Nothing acquires it by key; the last handle closed closes it."""
        entry = _Entry(self, (model.sha256, f"adopted {id(model)}"), model,
                       batch or BatchPolicy())
        handle = SharedModel(entry, model.name, model.version)
        entry.attach(handle)
        with self._lock:
            self._entries[entry.key] = entry
        return handle

    def _load(self, path: str | Path, options: dict[str, Any]) -> Model:
        try:
            return load_model(path, **options)
        except ModelMemoryError:
            # Models kept for a reload that no pipeline took back yet do not outrank a new one.
            with self._lock:
                idle, self._idle = self._idle, []
                for entry in idle:
                    self._entries.pop(entry.key, None)
            if not idle:
                raise
            for entry in idle:
                entry.close()
            return load_model(path, **options)

    def _attach(self, key: tuple[str, str], name: str, version: str | None
                ) -> SharedModel | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry in self._idle:
                self._idle.remove(entry)
            handle = SharedModel(entry, name, version)
            entry.attach(handle)
        logger.info("model %s shared by %s", name, ", ".join(entry.owners()))
        return handle

    def release(self, handle: SharedModel) -> None:
        entry = handle._shared_entry
        with self._lock:
            if entry.detach(handle):
                return
            if self._holds:  # a reload in progress may want it again
                self._idle.append(entry)
                return
            self._entries.pop(entry.key, None)
        entry.close()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Keep models whose last user closes inside the block, for a user acquiring them in
        it (a reload rebuilding a pipeline around the same model); the rest close at its end."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                idle = self._idle if not self._holds else []
                if not self._holds:
                    self._idle = []
                for entry in idle:
                    self._entries.pop(entry.key, None)
            for entry in idle:
                entry.close()

    def models(self) -> list[Model]:
        """The pooled models, one per key."""
        with self._lock:
            return [e.model for e in self._entries.values()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _options_key(options: Mapping[str, Any], policy: BatchPolicy) -> str:
    keyed = {k: v for k, v in options.items() if k not in _NOT_KEYED}
    keyed["batch"] = [*policy.key, policy.reason]
    return json.dumps(keyed, sort_keys=True, default=str)


_pool = ModelPool()


def model_pool() -> ModelPool:
    """The process-wide pool."""
    return _pool
