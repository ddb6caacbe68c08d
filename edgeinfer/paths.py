"""Where edgeinfer keeps state and caches: systemd's directories first, then XDG, then home."""

from __future__ import annotations

import os
from pathlib import Path


def _first_dir(env: str) -> Path | None:
    # systemd sets e.g. STATE_DIRECTORY=/var/lib/edgeinfer (colon-separated when several).
    value = os.environ.get(env)
    return Path(value.split(":")[0]) if value else None


def state_dir() -> Path:
    """Durable state: provider-probe decisions, TensorRT engines, the model store, the outbox."""
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
