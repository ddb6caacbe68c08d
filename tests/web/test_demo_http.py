"""`edgeinfer demo --http PORT`: the demo with the web view, its video looping until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from edgeinfer._net import free_port


def test_demo_serves_the_web_view_until_ctrl_c(tmp_path: Path, blazeface_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "EDGEINFER_DEMO_MODEL": str(blazeface_path)}
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "demo", "--http", str(port),
                             "--out", str(tmp_path / "r.jsonl")], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        status, deadline = None, time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=2) as r:
                    status = json.load(r)
                if status["stats"]["pipelines"]["faces"]["processed"] > 100:  # past one pass
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert status is not None, proc.stderr.read() if proc.poll() is not None else "no answer"
        assert status["stats"]["pipelines"]["faces"]["processed"] > 100  # the 90-frame clip loops
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert r.status == 200 and b"<html" in r.read().lower()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert f"web view on http://127.0.0.1:{port}/" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_demo_refuses_a_port_out_of_range(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "demo", "--http", "70000"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 78 and "--http: 70000 is not a TCP port" in done.stderr


def test_demo_with_its_port_taken_names_the_demos_own_fix(tmp_path: Path) -> None:
    """The demo has no config file: its fix for a port in use is `--http PORT`, not
    `http.port`. The port it suggests is free at that moment."""
    import re
    import socket

    port = free_port()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", port))
        taken.listen(1)
        done = subprocess.run([sys.executable, "-m", "edgeinfer", "demo", "--http", str(port)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 78, done.stderr
        assert f"port {port} on 127.0.0.1 is in use" in done.stderr
        assert "http.port" not in done.stderr and "Traceback" not in done.stderr
        fix = re.search(r"`edgeinfer demo --http (\d+)`", done.stderr)
        assert fix is not None, done.stderr
        suggested = int(fix.group(1))
        assert suggested != port
        with socket.socket() as probe:  # the suggestion works
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", suggested))
    assert not (tmp_path / "results.jsonl").exists()  # refused before anything ran
