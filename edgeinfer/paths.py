"""Where edgeinfer keeps state and caches: systemd's directories first, then XDG, then home."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path


def _first_dir(env: str) -> Path | None:
    # systemd sets e.g. STATE_DIRECTORY=/var/lib/edgeinfer (colon-separated when several).
    value = os.environ.get(env)
    return Path(value.split(":")[0]) if value else None


def state_dir() -> Path:
    """Durable state: provider-probe decisions, TensorRT engines, the model store, the outboxes,
    the lock that keeps a second daemon out (``edgeinfer.statelock``)."""
    return (
        _first_dir("EDGEINFER_STATE_DIR")
        or _first_dir("STATE_DIRECTORY")
        or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "edgeinfer"
    )


def cache_dir() -> Path:
    """Rebuildable caches: fetched example models, optimized ONNX graphs."""
    return (
        _first_dir("EDGEINFER_CACHE_DIR")
        or _first_dir("CACHE_DIRECTORY")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeinfer"
    )


def _file_part(text: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text)[:48]
    if safe != text:  # two names that differ only where they were made safe stay apart
        safe += "-" + hashlib.sha256(text.encode()).hexdigest()[:8]
    return safe


def outbox_path(state: Path, device_id: str, host: str, port: int) -> Path:
    """The default outbox of one device on one broker: ``<state>/outbox-<device>@<host>-<port>
    .sqlite3``, so two configs for different devices or brokers never share results."""
    return state / f"outbox-{_file_part(device_id)}@{_file_part(host)}-{port}.sqlite3"
