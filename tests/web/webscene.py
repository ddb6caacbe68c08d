"""The pipeline the web tests run: BlazeFace on the looping scene video (a face crossing a line
and a zone), with event snapshots and clips, as a config dict."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeinfer.testing.scene_video import SceneTruth


def scene_pipeline(name: str, truth: SceneTruth, model: Path, folder: Path,
                   clip_format: str = "mjpeg") -> dict[str, Any]:
    """One entry of ``pipelines:``; results go to ``folder/results.jsonl``."""
    return {
        "name": name,
        "source": {"type": "video", "uri": str(truth.path), "fps": truth.fps, "loop": True},
        "model": {"path": str(model), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        **truth.scene_config(),
        "record": {"snapshots": True, "events": ["enter", "exit", "cross"],
                   "clips": {"pre_s": 0.5, "post_s": 0.5, "fps": 7.5, "format": clip_format}},
        "sinks": [{"type": "jsonl", "path": str(folder / "results.jsonl")}],
    }


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "it",
             every: float = 0.1) -> Any:
    """``check()``'s first true value, polled until ``timeout``; else an AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def stop_daemon(proc: subprocess.Popen[Any]) -> int:
    """SIGTERM, then its exit code within 30 s (killed, and the timeout raised, if not)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise
