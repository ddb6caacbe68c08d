"""A process that validated a config exits cleanly (msgspec >= 0.21 could crash it at exit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "example.yaml"
CODE = f"""
from edgeinfer.config import load_config
load_config({str(EXAMPLE)!r})
print("loaded")
"""


def test_exit_after_loading_a_config_is_clean_every_time() -> None:
    # Without the exit hook about one run in three died of SIGSEGV in msgspec's final garbage
    # collection; twelve clean exits in a row are then very unlikely (under 1 %).
    for _ in range(12):
        proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                              timeout=120)

        assert (proc.returncode, proc.stdout) == (0, "loaded\n"), proc.stderr
