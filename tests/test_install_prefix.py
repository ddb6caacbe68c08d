"""install.sh refuses a prefix the unit's sandbox hides from the service (ProtectHome=,
PrivateTmp=): the venv there could not be executed and the unit would restart-loop."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _install(dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DESTDIR": str(dest)}
    return subprocess.run(["bash", str(ROOT / "scripts/install.sh"), "--no-enable", *args],
                          capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(("prefix", "reason"), [
    ("/home/pi/edgeinfer", "ProtectHome=yes"),
    ("/root/edgeinfer", "ProtectHome=yes"),
    ("/root", "ProtectHome=yes"),
    ("/tmp/edgeinfer", "PrivateTmp=yes"),
    ("/var/tmp/edgeinfer/", "PrivateTmp=yes"),
])
def test_a_prefix_hidden_by_the_sandbox_is_refused(tmp_path: Path, prefix: str,
                                                   reason: str) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    proc = _install(dest, "--prefix", prefix)
    assert proc.returncode == 1
    assert f"--prefix {prefix.rstrip('/')} cannot hold the service's venv" in proc.stderr
    assert reason in proc.stderr and "fail at step EXEC" in proc.stderr
    assert not any(dest.iterdir())  # refused before anything was made


def test_a_prefix_merely_named_like_home_is_not_refused(tmp_path: Path) -> None:
    # "/homestead" is not under /home: the check gets past it (to the next, unrelated error)
    proc = _install(tmp_path, "--prefix", "/homestead/edgeinfer", "--from", str(tmp_path))
    assert "cannot hold" not in proc.stderr and "not an edgeinfer source tree" in proc.stderr
