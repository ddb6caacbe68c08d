"""Long work says what it is doing to a person at a terminal, and nothing on a program's
non-interactive output (issue 30, item 14); a result's latencies have names.

The terminal is a real pseudo-terminal: ``load_model`` runs in a child whose stderr is a pty."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edgeinfer.frames import Frame, ModelRef, Result, TaskResult

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import logging, sys
if sys.argv[3] == "logging":
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s: %(message)s")
import edgeinfer
# recheck off: a first decision measured while the other test worker kept the CPUs busy is
# provisional, and the next load on a quiet box would measure it again, saying so (right, and
# tests/runtime/test_provisional.py's business); here the second load must open the pick.
with edgeinfer.load_model(sys.argv[1], state_dir=sys.argv[2], threads=1, probe_budget_s=2,
                          recheck=False) as m:
    print("loaded", m.provider)
"""
MEASURING = re.compile(r"face_detection_short_range\.tflite: measuring (\d+) backend candidates")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGEINFER_PROGRESS"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _on_a_terminal(model: Path, state: Path, code: str = CHILD, **env: str) -> tuple[str, str]:
    """(stdout, what the pty showed) of the child with stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code, str(model), str(state), "plain"],
                            stdout=subprocess.PIPE, stderr=slave, env=_env(**env))
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        out = proc.communicate(timeout=60)[0].decode()
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return out, seen.decode(errors="replace")


def test_measuring_says_so_on_a_terminal(blazeface_path: Path, tmp_path: Path) -> None:
    out, terminal = _on_a_terminal(blazeface_path, tmp_path / "s")
    assert out.startswith("loaded "), terminal
    m = MEASURING.search(terminal)
    assert m is not None and terminal[m.start() - len("edgeinfer: "):].startswith("edgeinfer: "), \
        terminal
    assert int(m.group(1)) >= 2
    assert "face_detection_short_range.tflite: picked " in terminal
    # the next process opens the cached pick: nothing to wait for, nothing said
    out, terminal = _on_a_terminal(blazeface_path, tmp_path / "s")
    assert out.startswith("loaded ") and "measuring" not in terminal, terminal
    # EDGEINFER_PROGRESS=0 keeps the terminal quiet
    out, terminal = _on_a_terminal(blazeface_path, tmp_path / "s2", EDGEINFER_PROGRESS="0")
    assert out.startswith("loaded ") and "measuring" not in terminal, terminal


FETCH = """
import sys
from pathlib import Path
from edgeinfer.model import catalog
try:
    catalog.fetch(catalog.CATALOG["nudenet-320n"], Path(sys.argv[2]) / "320n.onnx")
except Exception as exc:
    print("failed:", type(exc).__name__)
"""


def test_a_download_says_so_on_a_terminal(tmp_path: Path) -> None:
    # pip without an index fails at once, offline: what matters is the word before it waits
    out, terminal = _on_a_terminal(tmp_path, tmp_path, FETCH, PIP_NO_INDEX="1")
    assert out.strip() == "failed: ModelFetchError", (out, terminal)
    assert "edgeinfer: fetching nudenet-320n: downloading the PyPI wheel nudenet==3.4.2 for " \
        "nudenet/320n.onnx -> " in terminal, terminal


def test_nothing_on_a_pipe_and_once_through_logging_when_it_is_configured(
        blazeface_path: Path, tmp_path: Path) -> None:
    plain = subprocess.run([sys.executable, "-c", CHILD, str(blazeface_path),
                            str(tmp_path / "a"), "plain"], capture_output=True, text=True,
                           env=_env(), timeout=300, check=True)
    assert plain.stdout.startswith("loaded ")
    assert "measuring" not in plain.stderr and "edgeinfer:" not in plain.stderr, plain.stderr
    logged = subprocess.run([sys.executable, "-c", CHILD, str(blazeface_path),
                             str(tmp_path / "b"), "logging"], capture_output=True, text=True,
                            env=_env(), timeout=300, check=True)
    lines = [x for x in logged.stderr.splitlines() if MEASURING.search(x)]
    assert len(lines) == 1 and lines[0].startswith("LOG edgeinfer.runtime.select: "), \
        logged.stderr


def test_a_results_latencies_have_names() -> None:
    frame = Frame(3, time.monotonic(), time.time(), np.zeros((72, 128, 3), np.uint8))
    r = Result(seq=1, ts=time.time(), pipeline="cam", frame=frame,
               model=ModelRef("m", "1", "ab" * 32), provider="cpu",
               latency_ms=(1.25, 8.5, 0.375), task=TaskResult())
    lat = r.latency_ms
    assert (lat.pre, lat.infer, lat.post) == (1.25, 8.5, 0.375)
    pre, infer, post = lat  # still a tuple
    assert sum(lat) == lat.total == 10.125
    assert str(lat) == "pre 1.25 ms, infer 8.50 ms, post 0.38 ms"  # what print() shows
    assert repr(lat) == "Latency(pre=1.250, infer=8.500, post=0.375)"
    assert "latency_ms=Latency(pre=1.250" in repr(r)
    assert json.loads(r.to_json())["latency_ms"] == {"pre": 1.25, "infer": 8.5, "post": 0.375}
