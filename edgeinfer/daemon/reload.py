"""A reload that waits for the daemon's answer: what ``ExecReload=`` runs.

systemd 252 (Debian bookworm) has no ``Type=notify-reload``, and ``kill -HUP $MAINPID`` returns
before the daemon has re-read its config, also for one it then refuses. So the daemon writes
the outcome of every reload to a small JSON file, replaced atomically::

    {"pid": 1234, "generation": 3, "ok": false, "detail": "$.pipelines[0]...: ..."}

and `request_reload` (``edgeinfer reload``) notes the file's generation, sends ``SIGHUP``,
and waits until that daemon (same pid) reports a newer generation: success, or the refusal
as a `ConfigError`. The file lives in ``$RUNTIME_DIRECTORY`` (the unit's
``RuntimeDirectory=``), else in the state directory.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, StateError

RESULT_NAME = "reload.json"
POLL_S = 0.1


def result_path(state_dir: Path | None = None) -> Path | None:
    """Where the reload outcome goes: ``$RUNTIME_DIRECTORY/reload.json``, else
    ``state_dir/reload.json``; ``None`` when neither is known."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    if runtime:
        return Path(runtime) / RESULT_NAME
    return state_dir / RESULT_NAME if state_dir is not None else None


def write_result(path: Path, generation: int, ok: bool, detail: str) -> None:
    """Replace ``path`` with this reload's outcome (write, fsync-free rename: readers see the
    old or the new file, never half of one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"pid": os.getpid(), "generation": generation, "ok": ok,
                               "detail": detail}))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_result(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def request_reload(pid: int, path: Path, timeout_s: float = 90.0) -> dict[str, Any]:
    """Ask daemon ``pid`` to reload and wait for its answer.

    Returns:
        The outcome (``ok`` true), with the daemon's ``detail``.

    Raises:
        ConfigError: the daemon refused the config (it keeps running the old one).
        StateError: no such process, or no answer within ``timeout_s``.
    """
    before = read_result(path)
    seen = before["generation"] if before is not None and before.get("pid") == pid else 0
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError as exc:
        raise StateError(f"no daemon with pid {pid} to reload") from exc
    except PermissionError as exc:
        raise StateError(f"not allowed to signal pid {pid}: {exc}") from exc
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = read_result(path)
        if now is not None and now.get("pid") == pid and int(now.get("generation", 0)) > seen:
            if not now.get("ok"):
                raise ConfigError(f"reload refused, the running config is kept: "
                                  f"{now.get('detail', '')}")
            return now
        try:
            os.kill(pid, 0)
        except ProcessLookupError as exc:
            raise StateError(f"the daemon (pid {pid}) exited during the reload") from exc
        time.sleep(POLL_S)
    raise StateError(f"the daemon (pid {pid}) did not answer the reload within {timeout_s:g} s "
                     f"(no new outcome in {path})")
