"""Sessions a model opens beside the one serving it (measuring its backends in the background,
re-checking a decision: ``Model._measure``), each charged to the process memory budget while it
is open, so ``memory_budget_mb`` holds during a measurement too.

A side session is charged what the serving session was admitted at (the same model on another
backend or thread count costs about as much); a candidate that does not fit is refused with
``ModelMemoryError`` before it is opened, and the measurement stops with nothing swapped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping

import numpy as np

from .base import LoadReport, Session, SessionSpec, TensorSpec
from .choice import Choice
from .memory import MemoryBudget, process_budget

__all__ = ["ChargedOpener", "ChargedSession"]

_keys = itertools.count(-1, -1)  # budget keys of their own: load_model's count up from 1


class ChargedSession:
    """A ``Session`` whose share of the budget is released when it is closed (or ``detach``-ed
    by the model that adopts it, whose own charge then covers it)."""

    def __init__(self, inner: Session, budget: MemoryBudget, key: int) -> None:
        self.inner = inner
        self._budget = budget
        self._key = key
        self.inputs: tuple[TensorSpec, ...] = inner.inputs
        self.outputs: tuple[TensorSpec, ...] = inner.outputs
        self.report: LoadReport = inner.report

    @property
    def provider(self) -> str:
        return self.inner.provider

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.inner.run(feeds)

    def detach(self) -> Session:
        """Release the charge and hand out the session itself (the caller now accounts it)."""
        self._budget.release(self._key)
        return self.inner

    def close(self) -> None:
        self._budget.release(self._key)
        self.inner.close()


class ChargedOpener:
    """Wraps an opener (``select.open_choice``) so that every session it opens is charged
    ``mb`` against the budget while open.

    Args:
        opener: Opens ``choice`` of ``spec``.
        name: The model's name, for the refusal's message.
        mb: What one side session is charged.
        budget: Default: the process budget.
        doing: What the session is opened for, for the refusal's message.
    """

    def __init__(self, opener: Callable[[SessionSpec, Choice], Session], name: str, mb: float,
                 budget: MemoryBudget | None = None, *, doing: str = "measuring") -> None:
        self._opener = opener
        self._name = name
        self._doing = doing
        self._mb = mb
        self._budget = budget or process_budget()

    def __call__(self, spec: SessionSpec, choice: Choice) -> Session:
        key = next(_keys)
        self._budget.charge(key, f"{self._name} ({self._doing} {choice.label()} beside the "
                                 "session serving it)", self._mb)
        try:
            session = self._opener(spec, choice)
        except BaseException:
            self._budget.release(key)
            raise
        return ChargedSession(session, self._budget, key)
