"""sd_notify over a real datagram socket, the watchdog interval, journald-style logging, and the
exit code of a config error at boot."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeinfer import systemd
from edgeinfer.cli import JournalFormatter

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def notify_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    with tempfile.TemporaryDirectory(prefix="sd") as folder:  # AF_UNIX paths are short
        path = os.path.join(folder, "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.settimeout(2)
            monkeypatch.setenv("NOTIFY_SOCKET", path)
            yield sock


def test_notify_sends_key_value_lines_to_a_path_socket(notify_path: socket.socket) -> None:
    assert systemd.ready("2 pipelines, 14.8 fps,\n outbox 0")
    assert notify_path.recv(4096) == b"READY=1\nSTATUS=2 pipelines, 14.8 fps, outbox 0\n"
    assert systemd.watchdog() and notify_path.recv(4096) == b"WATCHDOG=1\n"
    assert systemd.stopping() and notify_path.recv(4096) == b"STOPPING=1\n"
    assert systemd.status("busy") and notify_path.recv(4096) == b"STATUS=busy\n"


def test_reloading_carries_monotonic_usec(notify_path: socket.socket) -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert systemd.reloading()
    lines = notify_path.recv(4096).decode().splitlines()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert lines[0] == "RELOADING=1"
    key, _, value = lines[1].partition("=")
    assert key == "MONOTONIC_USEC" and before <= int(value) <= after


def test_notify_to_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"edgeinfer-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify(READY=1, STATUS="ok")
        assert sock.recv(4096) == b"READY=1\nSTATUS=ok\n"


def test_without_notify_socket_everything_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not systemd.ready("x") and not systemd.watchdog() and not systemd.reloading()
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify")  # gone: no error either
    assert not systemd.notify(READY=1)


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert systemd.watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "1500000")
    assert systemd.watchdog_interval() == 1.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval() == 1.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert systemd.watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_PID")
    for bad in ("0", "soon", ""):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert systemd.watchdog_interval() is None


def test_journal_formatter_prefixes_syslog_priorities() -> None:
    fmt = JournalFormatter("%(name)s: %(message)s")

    def line(level: int, msg: str) -> str:
        return fmt.format(logging.LogRecord("edgeinfer.x", level, __file__, 1, msg, None, None))

    assert line(logging.ERROR, "bad") == "<3>edgeinfer.x: bad"
    assert line(logging.WARNING, "hm") == "<4>edgeinfer.x: hm"
    assert line(logging.INFO, "ok") == "<6>edgeinfer.x: ok"
    assert line(logging.DEBUG, "a\nb") == "<7>edgeinfer.x: a\n<7>b"


def _run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgeinfer", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **env}, timeout=60)


def test_logging_under_journald_has_no_timestamps(tmp_path: Path, blazeface_path: Path) -> None:
    # a model that loads but does not fit the task: the daemon logs why the pipeline did not
    # start (a missing model file is refused before, by `run`'s own check)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pipelines:\n  - name: p\n    source: {type: synthetic}\n"
                   "    model: {path: " + str(blazeface_path) + "}\n"
                   "    task: {type: classify}\n")
    journal = _run_cli("run", "-c", str(cfg), JOURNAL_STREAM="8:12345")
    plain = _run_cli("run", "-c", str(cfg), JOURNAL_STREAM="")
    assert journal.returncode == plain.returncode != 0
    logged = [x for x in journal.stderr.splitlines() if x.startswith("<")]
    assert logged and logged[0].startswith("<6>edgeinfer.model: loaded ")
    errors = [x for x in logged if x.startswith("<3>")]
    assert errors and errors[0].startswith("<3>edgeinfer.daemon: pipeline p not started")
    stamped = [x for x in plain.stderr.splitlines() if "ERROR edgeinfer.daemon" in x]
    assert stamped and stamped[0][:2] == "20"  # asctime


def test_config_error_at_boot_exits_78_with_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("pipelines:\n  - name: x\n    source: {type: synthetic}\n    bogus: 1\n")
    proc = _run_cli("run", "-c", str(cfg))
    assert proc.returncode == 78
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("edgeinfer: error: ") and "$.pipelines[0].bogus" in proc.stderr
    missing = _run_cli("run", "-c", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 78 and missing.stderr.count("\n") == 1


def test_run_takes_the_config_as_validate_config_does(tmp_path: Path) -> None:
    """`edgeinfer run config.yaml` (positional, as `validate-config` takes it) runs the config;
    no config, or two different ones, is one line naming the fix (was argparse's bare usage)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("pipelines:\n  - name: p\n    source: {type: synthetic, frames: 3}\n"
                   "    model: {path: missing.onnx}\n    task: {type: raw}\n")
    positional, flag = _run_cli("run", str(cfg)), _run_cli("run", "-c", str(cfg))
    assert positional.returncode == flag.returncode == 78  # the same check of the same file
    assert positional.stderr == flag.stderr and "missing.onnx" in positional.stderr
    none = _run_cli("run")
    assert none.returncode == 78 and none.stderr.count("\n") == 1
    assert "`edgeinfer run -c config.yaml`" in none.stderr and "usage:" not in none.stderr
    two = _run_cli("run", "-c", str(cfg), str(tmp_path / "other.yaml"))
    assert two.returncode == 78 and "two config files given" in two.stderr
