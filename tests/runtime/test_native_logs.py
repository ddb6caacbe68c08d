"""Native libraries' own log lines on fd 2 (LiteRT prints every accelerator it registers) go to
the debug log; everything else written meanwhile still reaches stderr. Checked at the fd level
in fresh processes, as a user running `edgeinfer` sees it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import logging, os, sys
logging.basicConfig(level=logging.DEBUG, format="DEBUGLOG %(message)s", stream=sys.stdout)
from edgeinfer._stderr import native_logs_to_debug
with native_logs_to_debug():
    os.write(2, b"INFO: [environment.cc:36] Creating LiteRT environment with options\n")
    os.write(2, b"WARNING: [npu_registry.cc:34] NPU accelerator could not be loaded\n")
    os.write(2, b"a real error from another thread\n")
    print("python's own stderr line", file=sys.stderr)
print("after", file=sys.stderr)
"""


def test_native_lines_go_to_debug_and_the_rest_passes(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "Creating LiteRT" not in proc.stderr and "NPU accelerator" not in proc.stderr
    assert proc.stderr.splitlines() == ["a real error from another thread",
                                        "python's own stderr line", "after"]
    assert "DEBUGLOG INFO: [environment.cc:36] Creating LiteRT" in proc.stdout


def test_measuring_a_tflite_model_prints_no_litert_internals(blazeface_path: Path,
                                                             tmp_path: Path) -> None:
    code = (f"import edgeinfer; m = edgeinfer.load_model({str(blazeface_path)!r}, "
            f"state_dir={str(tmp_path / 's')!r}, providers='litert'); "
            "print(m.selection['picked']); m.close()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    assert proc.stdout.startswith("litert xnnpack")
    assert "[environment.cc" not in proc.stderr and "Accelerator" not in proc.stderr, proc.stderr
    assert "Created TensorFlow Lite XNNPACK" not in proc.stderr, proc.stderr
