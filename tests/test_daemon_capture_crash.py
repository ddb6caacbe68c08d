"""``edgeinfer run`` with two cameras under a fake service manager (``NOTIFY_SOCKET``, as
``test_daemon_lifecycle.py``): SIGSEGV to one camera's capture process mid-run. The daemon
stays up and keeps its watchdog pinged, the other camera's results go on with no result and no
frame lost, the hit camera is back within 5 s, the log says why, and the daemon exits 0. The
same for SIGSEGV to one pipeline's model worker (``model.isolation: process``)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from edgeinfer.testing.streams import MjpegServer
from test_daemon_lifecycle import Manager, manager, start, stop, until  # noqa: F401

FPS = 10


def _capture_children(pid: int, module: bytes = b"edgeinfer.sources.capture_child"
                      ) -> list[int]:
    """The capture processes (or the processes running ``module``) among ``pid``'s
    children."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == pid and module in cmdline:
            found.append(int(entry.name))
    return found


def _results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_a_segfault_in_one_cameras_capture_costs_that_camera_a_restart_only(
        manager: Manager, blazeface_path: Path, tmp_path: Path) -> None:  # noqa: F811
    out = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    with MjpegServer(fps=FPS) as cam_a, MjpegServer(fps=FPS) as cam_b:
        cfg = tmp_path / "two.json"
        cfg.write_text(json.dumps({"runtime": {"state_dir": str(tmp_path / "state")},
                                   "pipelines": [{
            "name": name, "source": {"type": "camera", "uri": cam.url, "open_timeout_s": 5},
            "model": {"path": str(blazeface_path), "threads": 1},
            "task": {"type": "detect", "decoder": "blazeface"},
            "detect": {"gate": "always"}, "queue_size": 8,
            "sinks": [{"type": "jsonl", "path": str(out[name])}]}
            for name, cam in (("a", cam_a), ("b", cam_b))]}))
        proc = start(cfg, manager, tmp_path, WATCHDOG_USEC="2000000")
        try:
            manager.wait(lambda m: m.get("READY") == "1")
            until(lambda: all(len(_results(p)) >= 10 for p in out.values()), 60,
                  lambda: "first results")
            children = _capture_children(proc.pid)
            assert len(children) == 2, children
            os.kill(children[0], signal.SIGSEGV)
            killed = time.monotonic()
            until(lambda: len(_capture_children(proc.pid)) == 2
                  and children[0] not in _capture_children(proc.pid), 5,
                  lambda: "a new capture process")
            counts = {name: len(_results(p)) for name, p in out.items()}
            until(lambda: all(len(_results(p)) > counts[n] + 5 for n, p in out.items()), 15,
                  lambda: "results from both cameras again")
            assert time.monotonic() - killed < 5 + 15
            since = manager.count("WATCHDOG")
            manager.wait_count("WATCHDOG", since + 2)  # still pinged: nothing is stuck
            assert proc.poll() is None
        finally:
            code = stop(proc)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert "capture process crashed (SIGSEGV)" in stderr and "restarting in" in stderr
    assert "pipeline a is stuck" not in stderr and "pipeline b is stuck" not in stderr
    for name, path in out.items():
        results = _results(path)
        seqs = [int(r["seq"]) for r in results]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (name, seqs)  # none lost
        frames = [int(r["frame"]["index"]) for r in results]
        assert frames == sorted(set(frames)), (name, frames)
    # The hit camera was not read while its capture process was down (at least the 0.5 s
    # backoff between captured frames); the other one was read on at its 10 fps throughout.
    gaps = sorted(_longest_gap(path) for path in out.values())
    assert gaps[0] < 0.45 <= gaps[1], gaps


def _longest_gap(path: Path) -> float:
    """The longest time between two captured frames whose results were written."""
    ts = [float(r["frame"]["ts"]) for r in _results(path)]
    return max(b - a for a, b in zip(ts, ts[1:]))


def test_a_segfault_in_one_pipelines_model_worker_costs_that_worker_a_restart_only(
        manager: Manager, blazeface_path: Path, tmp_path: Path) -> None:  # noqa: F811
    worker = b"edgeinfer.runtime.worker_child"
    out = {name: tmp_path / f"{name}.jsonl" for name in ("a", "b")}
    with MjpegServer(fps=FPS) as cam_a, MjpegServer(fps=FPS) as cam_b:
        cfg = tmp_path / "two.json"
        cfg.write_text(json.dumps({"runtime": {"state_dir": str(tmp_path / "state")},
                                   "pipelines": [{
            "name": name, "source": {"type": "camera", "uri": cam.url, "open_timeout_s": 5},
            # threads differ: a worker of each pipeline's own, not one shared by both
            "model": {"path": str(blazeface_path), "threads": threads, "probe": False,
                      "isolation": "process"},
            "task": {"type": "detect", "decoder": "blazeface"},
            "detect": {"gate": "always"}, "queue_size": 8,
            "sinks": [{"type": "jsonl", "path": str(out[name])}]}
            for name, cam, threads in (("a", cam_a, 1), ("b", cam_b, 2))]}))
        proc = start(cfg, manager, tmp_path, WATCHDOG_USEC="2000000")
        try:
            manager.wait(lambda m: m.get("READY") == "1")
            until(lambda: all(len(_results(p)) >= 10 for p in out.values()), 60,
                  lambda: "first results")
            workers = _capture_children(proc.pid, worker)
            assert len(workers) == 2, workers
            os.kill(workers[0], signal.SIGSEGV)
            until(lambda: len(_capture_children(proc.pid, worker)) == 2
                  and workers[0] not in _capture_children(proc.pid, worker), 5,
                  lambda: "a new model worker")
            counts = {name: len(_results(p)) for name, p in out.items()}
            until(lambda: all(len(_results(p)) > counts[n] + 5 for n, p in out.items()), 15,
                  lambda: "results from both pipelines again")
            since = manager.count("WATCHDOG")
            manager.wait_count("WATCHDOG", since + 2)  # still pinged: nothing is stuck
            assert proc.poll() is None
        finally:
            code = stop(proc)
    stderr = (tmp_path / "stderr").read_text()
    assert code == 0, stderr
    assert "model worker crashed" in stderr and "SIGSEGV" in stderr, stderr
    assert "pipeline a is stuck" not in stderr and "pipeline b is stuck" not in stderr
    for name, path in out.items():
        seqs = [int(r["seq"]) for r in _results(path)]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (name, seqs)  # none lost
