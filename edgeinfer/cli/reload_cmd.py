"""``edgeinfer reload``: ask a running daemon to reload its config and wait for its answer
(the unit's ``ExecReload=``; exit 0 when reloaded, 78 when the config was refused)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def cmd_reload(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..paths import state_dir
    from ..daemon.reload import request_reload, result_path

    pid = args.pid or int(os.environ.get("MAINPID", "0") or 0)
    if pid <= 0:
        raise ConfigError("reload: pass --pid PID (the daemon's; systemd passes $MAINPID)")
    path = Path(args.file) if args.file else result_path(state_dir())
    assert path is not None  # with a state dir, result_path always answers
    outcome = request_reload(pid, path, args.timeout)
    print(f"reloaded: {outcome.get('detail', '')}", file=sys.stderr)
    return 0
