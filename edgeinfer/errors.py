"""The one exception tree of edgeinfer.

Library code raises these; only ``edgeinfer.cli`` turns them into messages and exit codes.
Third-party errors (onnxruntime, LiteRT, msgspec, YAML) are converted once, where they are
caught, with ``raise X from exc`` so the original stays in the chain::

    EdgeInferError                      exit 1
    ├── ConfigError                     exit 78  (EX_CONFIG) bad config file or option
    ├── ModelError                      exit 65  (EX_DATAERR)
    │   ├── ModelNotFoundError          exit 66  (EX_NOINPUT) no such file
    │   ├── ModelFormatError                     not a model, truncated, corrupt, unsupported
    │   ├── UnsafeModelError                     external data outside the model's folder
    │   ├── ModelTooLargeError                   over max_model_mb
    │   ├── ModelLoadError                       the runtime refused the model
    │   ├── OutputLayoutError                    a running model's outputs do not fit its decoder
    │   └── ModelFetchError                      an example model could not be fetched/verified
    ├── ModelMemoryError                exit 71  the model would break its limit or the budget
    ├── InvalidInputError               exit 65  run() got a wrong name, shape or dtype (also ValueError)
    ├── InferenceError                  exit 70  (EX_SOFTWARE) the runtime failed during run()
    │   └── WorkerCrashedError          exit 70  an isolated worker process died
    ├── SourceError                     exit 74  (EX_IOERR) a source cannot be opened or read
    ├── ProviderError                   exit 69  (EX_UNAVAILABLE)
    │   ├── BackendUnavailableError              onnxruntime / LiteRT not installed
    │   └── ProviderFallbackError                strict_providers and the runtime fell back
    ├── StateError                      exit 70  a closed model used, a resource misused
    ├── PipelineBuildError              exit 70  building one pipeline failed unforeseen: its
    │                                            failure (the others run on), with the cause
    ├── AlreadyRunningError             exit 75  (EX_TEMPFAIL) another process holds the state dir
    ├── StorageError                    exit 73  (EX_CANTCREAT) state (the outbox) cannot be created
    │   └── StorageDataError                     the database refused the data itself, not the
    │                                            connection: writing it again fails the same way
    └── OtaError                        exit 65  a model update cannot be sent or applied
        └── OtaRejected                          a device refuses an update; ``.reason`` says why
"""

from __future__ import annotations

__all__ = [
    "AlreadyRunningError",
    "BackendUnavailableError",
    "ConfigError",
    "EdgeInferError",
    "InferenceError",
    "InvalidInputError",
    "ModelError",
    "ModelFetchError",
    "ModelFormatError",
    "ModelLoadError",
    "ModelMemoryError",
    "ModelNotFoundError",
    "ModelTooLargeError",
    "OtaError",
    "OutputLayoutError",
    "OtaRejected",
    "PipelineBuildError",
    "ProviderError",
    "ProviderFallbackError",
    "SourceError",
    "StateError",
    "StorageDataError",
    "StorageError",
    "UnsafeModelError",
    "WorkerCrashed",
    "WorkerCrashedError",
]


class EdgeInferError(Exception):
    """Base of every error edgeinfer raises on purpose."""

    exit_code: int = 1


class ConfigError(EdgeInferError):
    """A config file or option is wrong; the message names the path (``$.pipelines[0]...``)."""

    exit_code = 78


class ModelError(EdgeInferError):
    """A model file cannot be used."""

    exit_code = 65


class ModelNotFoundError(ModelError):
    """The model file does not exist or cannot be read."""

    exit_code = 66


class ModelFormatError(ModelError):
    """The file is not a model edgeinfer can read: unknown format, truncated or corrupt."""


class UnsafeModelError(ModelError):
    """The model refers to files outside its own folder (ONNX external data)."""


class ModelTooLargeError(ModelError):
    """The model is larger than ``max_model_mb``."""


class ModelLoadError(ModelError):
    """The runtime refused to build a session from the model."""


class OutputLayoutError(ModelError):
    """A running model's outputs do not fit the decoder reading them (scores outside [0, 1], boxes
    outside the frame, class ids beyond the labels): every result would be wrong, so the pipeline
    stops; the message names the likely layout and the fix."""


class ModelFetchError(ModelError):
    """An example model could not be downloaded, extracted or verified."""


class ModelMemoryError(EdgeInferError):
    """Loading or running the model would break its ``memory_limit_mb`` or the process budget."""

    exit_code = 71


class InvalidInputError(EdgeInferError, ValueError):
    """``Model.run`` got inputs of the wrong name, shape or dtype."""

    exit_code = 65


class InferenceError(EdgeInferError):
    """The runtime failed while running a model."""

    exit_code = 70


class WorkerCrashedError(InferenceError):
    """The worker process of an ``isolation: process`` session died; ``Model.restart()`` revives it."""


# The name the issue tracker and ARCHITECTURE.md use.
WorkerCrashed = WorkerCrashedError


class SourceError(EdgeInferError):
    """A source cannot be opened or read (the message names its URI); live sources retry first."""

    exit_code = 74


class ProviderError(EdgeInferError):
    """No usable execution provider, or the one required is not the one running."""

    exit_code = 69


class BackendUnavailableError(ProviderError):
    """The runtime package a model needs (onnxruntime, ai-edge-litert) is not installed."""


class ProviderFallbackError(ProviderError):
    """``strict_providers`` is on and the runtime fell back from the provider asked for."""


class StateError(EdgeInferError):
    """An object was used in a state that does not allow it (a closed model, a dead worker)."""

    exit_code = 70


class PipelineBuildError(EdgeInferError):
    """Building one pipeline raised something no check foresaw (a model file's metadata or
    shapes that a parser, decoder or numpy chokes on, or a bug): that pipeline fails with the
    cause in its reason, and with ``required: false`` the daemon and the other pipelines run
    on. The original exception is its ``__cause__``."""

    exit_code = 70


class AlreadyRunningError(EdgeInferError):
    """Another edgeinfer process holds the state directory (or the outbox) this one would use;
    the message names it (pid, host, command line)."""

    exit_code = 75


class StorageError(EdgeInferError):
    """Durable state cannot be created or written (a full disk, a read-only or missing folder);
    the message names the file."""

    exit_code = 73


class StorageDataError(StorageError):
    """The database refused what was written (a value out of a column's range, a character it
    cannot store), not the connection: retrying the same rows fails the same way, so the rows
    are isolated and set aside instead (the fleet collector's ``rejected`` table)."""


class OtaError(EdgeInferError):
    """A model update cannot be pushed, received or applied (see ``docs/ota.md``)."""

    exit_code = 65


class OtaRejected(OtaError):
    """An update refused with a reason code (``bad_signature``, ``sha256_mismatch``, ...) that
    goes on the device's OTA status topic next to the message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
