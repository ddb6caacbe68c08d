"""``edgeinfer run -c CONFIG`` and ``edgeinfer demo``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "demo.yaml"  # also configs/demo.yaml


def cmd_run(args: argparse.Namespace) -> int:
    from ..config import load_config
    from ..daemon import Daemon

    config = load_config(args.config)
    _apply_log_level(args, config.logging.level)
    daemon = Daemon(config, config_path=args.config, stats_interval_s=args.stats_interval)
    code = daemon.run()
    _print_summary(daemon)
    return code


def cmd_demo(args: argparse.Namespace) -> int:
    """Fetch the demo model and sample video, then run the demo config on them."""
    import os

    from .. import samples
    from ..catalog import pull
    from ..config import load_config
    from ..daemon import Daemon

    model = pull("blazeface")
    video = samples.demo_video()
    os.environ.setdefault("EDGEINFER_DEMO_MODEL", str(model))
    os.environ.setdefault("EDGEINFER_DEMO_VIDEO", str(video))
    os.environ.setdefault("EDGEINFER_DEMO_OUT", str(Path(args.out).resolve()))
    config = load_config(DEMO_CONFIG)
    _apply_log_level(args, config.logging.level)
    print(f"edgeinfer demo: BlazeFace on {video} -> stdout and {args.out}", file=sys.stderr)
    daemon = Daemon(config)
    code = daemon.run()
    _print_summary(daemon)
    return code


def _apply_log_level(args: argparse.Namespace, level: str) -> None:
    if not args.verbose:
        logging.getLogger().setLevel(level.upper())


def _print_summary(daemon: object) -> None:
    for s in daemon.summary():  # type: ignore[attr-defined]
        lat = s["latency_ms"]
        print(
            f"{s['pipeline']}: {s['processed']} frames, {s['emitted']} results, "
            f"{s['fps']:.1f} fps, infer p50 {lat['infer']['p50']:.1f} ms, "
            f"dropped {s['dropped']['queue']}, errors {s['errors']}, "
            f"source corrupt {s['source']['corrupt']}, reconnects {s['source']['reconnects']}"
            + (f" ({s['state']}: {s['last_error']})" if s["state"] == "failed" else ""),
            file=sys.stderr,
        )
    for name, reason in getattr(daemon, "failed", {}).items():
        print(f"{name}: not started: {reason}", file=sys.stderr)


def summary_json(daemon: object) -> str:
    return json.dumps(daemon.summary())  # type: ignore[attr-defined]
