"""A pipeline's health: one state, with the reason in words, that every surface reads (the
stats and status topics, Home Assistant's availability, ``/v1/pipelines`` and the web page,
``STATUS=``, the exit summary).

States::

    starting ──► running ◄──► paused
        │           │ ▲
        │           ▼ │ first good frame again
        │       reconnecting   (the source worked, then was lost: retrying with backoff;
        │                       or its capture process or model worker crashed: restarting it)
        ▼
    no_source                  (the source never opened: retrying with backoff)
    failed                     (a stage or the source gave up: the pipeline ended)
    done                       (the source ended: a file read to its end, or stopped)

Only ``running`` is healthy; the others carry ``reason`` (what is wrong and the fix; ``running``
may carry one too: a camera that left broken frames out, for a minute after the last),
``retries`` (reopen attempts so far) and ``next_retry_at`` (Unix time) where they apply.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["STATES", "Health"]

STATES = ("starting", "running", "paused", "reconnecting", "no_source", "failed", "done")


@dataclass(frozen=True, slots=True)
class Health:
    """One pipeline's (or live source's) state; see the module.

    Attributes:
        state: One of ``STATES``.
        reason: Why it is not running, in words, with the fix (``""`` while running).
        retries: Reopen attempts of the source so far (all outages together).
        next_retry_at: When the source is tried again (Unix time; ``None``: not waiting).
    """

    state: str
    reason: str = ""
    retries: int = 0
    next_retry_at: float | None = None

    @property
    def ok(self) -> bool:
        """Whether the pipeline does its job (``running``)."""
        return self.state == "running"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "retries": self.retries,
                "next_retry_at": (round(self.next_retry_at, 3)
                                  if self.next_retry_at is not None else None)}

    def describe(self, now: float | None = None) -> str:
        """One line: ``no_source: no such device /dev/video9: ...; 4 retries, next in 3 s``."""
        text = self.state + (f": {self.reason}" if self.reason else "")
        if self.retries or self.next_retry_at is not None:
            text += f"; {self.retries} retr{'y' if self.retries == 1 else 'ies'}"
            if self.next_retry_at is not None:
                wait = max(0.0, self.next_retry_at - (time.time() if now is None else now))
                text += f", next in {wait:.0f} s"
        return text
