"""Results an outbox file holds that are not this daemon's to send as they lie: the shared
``outbox.sqlite3`` of versions before per-device outboxes (adopted), and rows another device
wrote into a file it shared (set aside). Works through ``Outbox``'s public methods only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .outbox import Outbox

__all__ = ["adopt_legacy", "set_aside_others"]


def adopt_legacy(outbox: Outbox, legacy: Path, topic_prefix: str) -> int:
    """Move into ``outbox`` the results waiting in ``legacy`` (the one ``outbox.sqlite3`` that
    versions before per-device outboxes shared) whose topic starts with ``topic_prefix``
    (``<prefix>/<device>/``), oldest first. The seqs it remembers per pipeline are taken too
    (they were not kept per device: a seq may jump ahead, never go back). ``legacy`` stays, for
    the other devices that shared it. Returns how many results moved."""
    moved = 0
    with Outbox(legacy) as old:
        outbox.copy_in([], old.remembered_seqs())
        while batch := old.topics(prefix=topic_prefix, limit=500):
            n = old.move_to(outbox, [msg_id for msg_id, _ in batch], remember=False)
            if n == 0:  # nothing moved: never loop on the same rows
                break
            moved += n
    return moved


def set_aside_others(outbox: Outbox, device: str) -> tuple[Path, int] | None:
    """Move the results in ``outbox`` that another device made (their topic's device level,
    ``<prefix>/<device>/<pipeline>/result``, is not ``device``) into ``<name>.foreign-<UTC
    time>``, kept there and never published by this one. Only a file written before outboxes
    recorded their owner can hold such rows (one ``mqtt.outbox.path`` shared by two configs).
    Returns that file and how many moved, or ``None`` when there were none."""
    others = [msg_id for msg_id, topic in outbox.topics()
              if topic.rsplit("/", 3)[-3:-2] != [device]]
    if not others:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = outbox.path.with_name(f"{outbox.path.name}.foreign-{stamp}")
    with Outbox(aside) as kept:
        outbox.move_to(kept, others)
    os.unlink(f"{aside}.lock")  # a name nobody else has opened: its lock file is only litter
    return aside, len(others)
