"""Results appended to a JSON Lines file, one object per line, flushed after each line."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import ConfigError
from ..frames import Result
from .base import Sink

logger = logging.getLogger(__name__)


class JsonlSink(Sink):
    def __init__(self, config: Any, **_: Any) -> None:
        super().__init__(config)
        self.path = Path(config.path)
        self._file: BinaryIO | None = None

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (held until close)
            logger.info("results appended to %s", self.path)
        except OSError as exc:
            raise ConfigError(f"jsonl sink {self.path}: {exc.strerror or exc}") from exc

    def write(self, result: Result) -> None:
        if self._file is None:
            self.open()
        assert self._file is not None
        # One write per line: a reader never sees half a line, even if we are killed.
        self._file.write(result.to_json() + b"\n")
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            try:
                f.flush()
                os.fsync(f.fileno())
            finally:
                f.close()
