"""`edgeinfer run` starts the cameras' capture processes as soon as the config is valid,
before it imports the daemon and loads the models (``daemon/early.py``): the daemon uses them,
a start that is refused ends them, and none opens its camera before its pipeline starts."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from edgeinfer.cli import run_cmd
from edgeinfer.config import load_config
from edgeinfer.daemon import Daemon
from edgeinfer.daemon.early import release, start_captures
from edgeinfer.errors import ConfigError
from edgeinfer.sources.isolated import ProcessSource
from edgeinfer.testing.streams import MjpegServer


def _pid(source: Any) -> int:
    assert isinstance(source, ProcessSource) and source.pid is not None
    return source.pid


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # a zombie until its parent reaps it: gone as a process that runs
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z":
                return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


def _config(tmp_path: Path, blazeface: Path, url: str, **sources: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "runtime": {"state_dir": str(tmp_path / "state")},
        "pipelines": [{"name": name, "source": source,
                       "model": {"path": str(blazeface), "threads": 1},
                       "task": {"type": "detect", "decoder": "blazeface"},
                       "sinks": [{"type": "jsonl", "path": str(tmp_path / f"{name}.jsonl")}]}
                      for name, source in sources.items()]}))
    return path


def test_the_daemon_runs_the_capture_process_started_before_it(
        tmp_path: Path, blazeface_path: Path) -> None:
    with MjpegServer(fps=10) as cam:
        path = _config(tmp_path, blazeface_path, cam.url,
                       process={"type": "camera", "uri": cam.url, "isolation": "process"},
                       thread={"type": "camera", "uri": cam.url, "isolation": "thread"},
                       synthetic={"type": "synthetic", "width": 64, "height": 48})
        config = load_config(str(path))
        early = start_captures(config)
        assert set(early) == {"process"}  # only what starts a process is worth starting early
        held_config, source = early["process"]
        assert held_config is config.pipelines[0].source and isinstance(source, ProcessSource)
        pid = source.pid
        assert pid is not None
        time.sleep(0.5)
        assert cam.clients == 0  # started, not opened: the pipeline opens it
        daemon = Daemon(config, config_path=str(path), early=dict(early))
        daemon.startup()
        try:
            used = next(p for p in daemon.pipelines if p.name == "process")
            assert used.source is source and source.pid == pid
            deadline = time.monotonic() + 30
            while (tmp_path / "process.jsonl").read_text().count("\n") < 3:
                assert time.monotonic() < deadline, "no results from the early capture process"
                time.sleep(0.05)
        finally:
            daemon.shutdown()
        assert _gone(pid)


def test_an_early_source_the_daemon_does_not_use_is_ended(
        tmp_path: Path, blazeface_path: Path) -> None:
    with MjpegServer(fps=10) as cam:
        camera = {"type": "camera", "uri": cam.url, "isolation": "process"}
        path = _config(tmp_path, blazeface_path, cam.url, a=camera)
        config = load_config(str(path))
        stale = start_captures(config)  # built for another config object: a reload's, say
        other = start_captures(load_config(str(path)))
        orphan = {"gone": other.pop("a")}  # a pipeline the config no longer has
        early = {**stale, **orphan}
        pids = [_pid(held[1]) for held in early.values()]
        fresh = load_config(str(path))
        daemon = Daemon(fresh, config_path=str(path), early=early)
        daemon.startup()
        try:
            for pid in pids:
                assert _gone(pid), "an unused capture process still runs"
            source = daemon.pipelines[0].source
            assert isinstance(source, ProcessSource) and source.pid not in pids
        finally:
            daemon.shutdown()


def test_a_start_refused_after_the_capture_processes_started_ends_them(
        tmp_path: Path, blazeface_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with MjpegServer(fps=10) as cam:
        path = _config(tmp_path, blazeface_path, cam.url,
                       a={"type": "camera", "uri": cam.url, "isolation": "process"})
        started: list[int] = []
        real = start_captures

        def spy(config: Any) -> Any:
            early = real(config)
            started.extend(_pid(held[1]) for held in early.values())
            return early

        def refuse(where: str, config: Any) -> None:
            raise ConfigError(f"{where}: cannot start: refused by the test")

        monkeypatch.setattr("edgeinfer.daemon.early.start_captures", spy)
        monkeypatch.setattr(run_cmd, "_refuse_unstartable", refuse)
        args = argparse.Namespace(config=str(path), config_file=None, stats_interval=0.0,
                                  verbose=1)
        with pytest.raises(ConfigError, match="refused by the test"):
            run_cmd.cmd_run(args)
        assert len(started) == 1
        assert _gone(started[0]) and cam.clients == 0


def test_release_ends_every_capture_process(tmp_path: Path, blazeface_path: Path) -> None:
    with MjpegServer(fps=10) as cam:
        path = _config(tmp_path, blazeface_path, cam.url,
                       a={"type": "camera", "uri": cam.url, "isolation": "process"},
                       b={"type": "camera", "uri": cam.url, "isolation": "process"})
        early = start_captures(load_config(str(path)))
        pids = [_pid(held[1]) for held in early.values()]
        release(early)
        assert early == {} and all(_gone(pid) for pid in pids)
