"""``edgeinfer reload``: ask a running daemon to reload its config and wait for its answer
(the unit's ``ExecReload=``; exit 0 when reloaded, 78 when the config was refused)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import ConfigError
from ..paths import state_dir
from ..daemon.reload import request_reload, result_path


def add_reload_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Send the daemon SIGHUP and wait until it reports the reload's outcome: exit "
                     "0 when reloaded, 78 when it refused the config (it keeps the running one). "
                     "The unit's ExecReload= runs this.")
    p.add_argument("--pid", type=int, help="the daemon's pid (default: $MAINPID)")
    p.add_argument("--file", help="the outcome file the daemon writes (default: "
                   "$RUNTIME_DIRECTORY/reload.json, else the state directory's)")
    p.add_argument("--timeout", type=float, default=90.0, metavar="S",
                   help="give up after S seconds (default: %(default)s)")


def cmd_reload(args: argparse.Namespace) -> int:
    pid = args.pid or int(os.environ.get("MAINPID", "0") or 0)
    if pid <= 0:
        raise ConfigError("reload: pass --pid PID (the daemon's; systemd passes $MAINPID)")
    path = Path(args.file) if args.file else result_path(state_dir())
    assert path is not None  # with a state dir, result_path always answers
    outcome = request_reload(pid, path, args.timeout)
    print(f"reloaded: {outcome.get('detail', '')}", file=sys.stderr)
    return 0
