"""``edgeinfer run``: the daemon and what only it uses.

    lifecycle   the `Daemon`: startup -> tick loop -> shutdown (the control plane's `Host`)
    health      the stall policy: when a pipeline is stuck, restart budget, giving up
    reload      the reload outcome file ``edgeinfer reload`` waits on
    sandbox     the systemd drop-in allowing exactly the ports a config listens on
    startable   whether a valid config can start on this machine (``run``, ``validate-config``)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .health import MIN_STALL_S, RESTART_BUDGET, RESTART_CLOSE_S, RESTART_WINDOW_S, stall_policy

if TYPE_CHECKING:
    from .lifecycle import EXIT_FORCED, STATUS_INTERVAL_S, TICK_S, Daemon

__all__ = ["EXIT_FORCED", "MIN_STALL_S", "RESTART_BUDGET", "RESTART_CLOSE_S",
           "RESTART_WINDOW_S", "STATUS_INTERVAL_S", "TICK_S", "Daemon", "stall_policy"]

_LIFECYCLE = frozenset({"Daemon", "EXIT_FORCED", "STATUS_INTERVAL_S", "TICK_S"})


def __getattr__(name: str) -> Any:
    # The Daemon pulls in numpy, paho and the whole data plane (about a second on a small
    # board): loaded on first use, so that `edgeinfer reload` (the unit's ExecReload=) and
    # `validate-config`, which use only reload, sandbox and startable, do not pay for it.
    if name in _LIFECYCLE:
        from . import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
