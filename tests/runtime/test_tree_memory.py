"""The whole daemon's memory: the PSS of this process and every process it started (issue 32,
item 7), as the stats topic, the web page and ``edgeinfer watch`` show it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from edgeinfer.cli.watch_cmd import describe
from edgeinfer.runtime.memory import tree_memory

CHILD = """
import sys, time
block = bytearray(64 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident
sys.stdout.write("ready\\n"); sys.stdout.flush()
time.sleep(60)
"""


def test_a_child_and_its_memory_are_counted() -> None:
    alone = tree_memory()
    assert alone.processes >= 1 and alone.pss_mb > 1 and alone.estimated == 0
    # a grandchild too: the shell runs Python and waits, as a worker runs a measuring child
    proc = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c \'{CHILD}\'; exit 0'],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        below = tree_memory(pid=proc.pid)
        assert below.processes == 2 and below.estimated == 0  # the shell and its Python
        assert below.pss_mb > 64, below  # 64 MiB touched, and Python itself
        mine = tree_memory()  # other tests' helpers may come and go: at least these
        assert mine.processes >= 1 + below.processes and mine.pss_mb > below.pss_mb
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the shell and its Python: their own group
        proc.wait()
    assert tree_memory(pid=proc.pid).processes == 0


def test_a_pid_that_is_gone_counts_nothing_and_no_proc_falls_back(tmp_path: object) -> None:
    gone = tree_memory(pid=2 ** 22 + 12345)  # past pid_max's default: no such process
    assert gone.processes == 0 and gone.pss_mb == 0
    fallback = tree_memory(proc="/nonexistent-proc")
    assert fallback.processes == 1 and fallback.estimated == 1 and fallback.pss_mb > 1


def test_watch_shows_the_whole_daemon() -> None:
    payload = (b'{"ts": 1, "device": "d", "uptime_s": 5, "memory_mb": 90.5, '
               b'"memory": {"pss_mb": 210.3, "processes": 3, "estimated": 0}}')
    _, line = describe("edgeinfer/d/stats", payload, "edgeinfer")
    assert "memory 210.3 MiB PSS in 3 processes" in line and "90.5" not in line
    alone = payload.replace(b'"processes": 3', b'"processes": 1')
    assert "memory 90.5 MiB" in describe("edgeinfer/d/stats", alone, "edgeinfer")[1]
