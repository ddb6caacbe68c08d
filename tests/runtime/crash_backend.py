"""A backend that crashes the process running it (tests/runtime/test_guarded_measure.py):
``SIGSEGV`` by reading address 0, or ``SIGABRT``, as native code does. ``CRASHY_HOW`` says how
(``segv``, ``abort``) and ``CRASHY_WHEN`` when (``open``, ``run``); they reach the measuring
child through its environment.

In the process whose pid is ``CRASHY_SPARE_PID`` (the test's own) it raises instead of crashing:
a selector that ran it there, not in a child, fails that test instead of killing the test run.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

import numpy as np

from edgeinfer.runtime.base import Choice, LoadReport, SessionSpec, TensorSpec

NAME = "crashy"


def _crash(where: str) -> None:
    if os.environ.get("CRASHY_SPARE_PID") == str(os.getpid()):
        raise AssertionError(f"the crashing backend was {where} in the test's own process")
    if os.environ.get("CRASHY_HOW", "segv") == "abort":
        os.abort()
    ctypes.string_at(0)  # SIGSEGV


class CrashySession:
    def __init__(self, spec: SessionSpec, choice: Choice) -> None:
        self.report = LoadReport(backend=NAME, provider=choice.provider, choice=choice,
                                 requested=(choice.provider,))
        self.inputs = (TensorSpec("x", (1, 16, 96, 96), "float32"),)  # the test's model
        self.outputs = (TensorSpec("y", (1, 16, 96, 96), "float32"),)

    @property
    def provider(self) -> str:
        return self.report.provider

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        _crash("run")
        return {}

    def close(self) -> None:
        pass


def available() -> bool:
    return True


def precisions() -> tuple[str, ...]:
    return ("fp32",)


def version() -> str:
    return "0.1"


def open_session(spec: SessionSpec) -> CrashySession:
    if os.environ.get("CRASHY_WHEN", "run") == "open":
        _crash("opened")
    return CrashySession(spec, spec.choice or Choice(NAME, "CPU", "fp32", spec.threads))
