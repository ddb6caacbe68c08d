"""The ``Sink`` interface: where results go. A sink is a context manager; ``write`` is called
from the pipeline's emit thread, one result at a time, and must not block for long (the MQTT
sink hands results to its durable outbox)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Self

from ..frames import Result


class Sink(ABC):
    def __init__(self, config: Any) -> None:
        self.config = config
        self.written = 0
        self.errors = 0

    def open(self) -> None:
        """Acquire the file, connection or stream."""

    @abstractmethod
    def write(self, result: Result) -> None:
        """Deliver one result."""

    def close(self) -> None:
        """Flush and release; idempotent."""

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
