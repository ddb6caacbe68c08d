"""OpenCV's own ``[ WARN:0@0.023] global cap_v4l.cpp:914 open VIDEOIO(V4L2:/dev/video7): can't
open camera by index`` lines reached the user beside edgeinfer's own message."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
from edgeinfer.config.pipeline import CameraSource as CameraConfig, ReconnectConfig
from edgeinfer.errors import SourceError
from edgeinfer.sources.camera import CameraSource
try:
    config = CameraConfig(uri="7", reconnect=ReconnectConfig(initial_s=0.01, max_attempts=1))
    with CameraSource(config) as src:
        list(src)
except SourceError as exc:
    print("SourceError:", exc)
import cv2
print(cv2.imread("/nonexistent.png"))
"""


def _run(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "OPENCV_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          timeout=60, env={**clean, **env})


def test_opencv_warnings_do_not_reach_the_user_but_edgeinfers_message_does() -> None:
    proc = _run()
    assert proc.returncode == 0, proc.stderr
    assert "SourceError: camera 7:" in proc.stdout
    assert "WARN" not in proc.stderr, proc.stderr


def test_a_users_opencv_log_level_is_kept() -> None:
    proc = _run(OPENCV_LOG_LEVEL="WARNING")
    assert "[ WARN" in proc.stderr and "imread_('/nonexistent.png')" in proc.stderr, proc.stderr
