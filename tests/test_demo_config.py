"""``edgeinfer run -c configs/demo.yaml`` works from a checkout, as it is, and leaves the checkout
as it was; ``models pull`` and ``demo`` say what they are doing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgeinfer._net import free_port

ROOT = Path(__file__).resolve().parent.parent


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEINFER_DEMO_")}
    return {**env, "HOME": str(home), **extra}


def test_run_configs_demo_from_a_checkout(tmp_path: Path) -> None:
    before = sorted(p.name for p in (ROOT / "configs").iterdir())
    proc = subprocess.run(
        [sys.executable, "-m", "edgeinfer", "run", "-c", str(ROOT / "configs" / "demo.yaml")],
        cwd=tmp_path, env=_env(tmp_path, EDGEINFER_DEMO_PORT=str(free_port())),
        capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "edgeinfer-demo-results.jsonl"
    assert f"results appended to {out}" in proc.stderr  # says where they go
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 90 and all(d["detections"] for d in lines)
    assert sorted(p.name for p in (ROOT / "configs").iterdir()) == before
    # the clip was made in the samples cache, not next to the config
    assert (Path(os.environ["EDGEINFER_CACHE_DIR"]) / "samples" / "demo.mp4").is_file()
