"""``edgeinfer run`` as a real subprocess on a real mosquitto, for the command tests."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgeinfer import samples

ROOT = Path(__file__).resolve().parents[2]


class Run:
    """One ``edgeinfer run`` of a config written to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(path)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=ROOT)

    def stop(self) -> str:
        """SIGTERM, wait; returns stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, stderr = self.proc.communicate(timeout=30)
        return stderr

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def daemon_config(host: str, port: int, model: Path, folder: Path, device: str,
                  **mqtt: Any) -> dict[str, Any]:
    """A one-pipeline config (``faces``: BlazeFace on a looping video) for ``device``."""
    video = folder / "v.avi"
    if not video.exists():
        samples.demo_video(video, frames=30)
    return {
        "device_id": device,
        "runtime": {"state_dir": str(folder / "state")},
        "mqtt": {"host": host, "port": port, "stats_interval_s": 0.5, **mqtt},
        "pipelines": [{
            "name": "faces",
            "source": {"type": "video", "uri": str(video), "fps": 20, "loop": True},
            "model": {"path": str(model), "threads": 1},
            "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
            "sinks": [{"type": "mqtt"}],
        }],
    }
