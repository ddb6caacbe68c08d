"""`.ci/run` installs every program the tests and benchmarks call (issue 30, item 16).

A fresh CI machine has only the base image: a test that calls a program nobody installed fails
there (or is skipped, which CI forbids), while it passes on a developer's machine where the
program happened to be. The programs are found by reading the tests, the test launchers and the
benchmarks: a ``shutil.which("X")`` or a command list starting with ``"X"``. Each must map to a
Debian package in ``.ci/run``'s APT_PACKAGES, or be part of the base image (listed below with why).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# program -> the Debian package .ci/run installs for it
PACKAGE_OF = {
    "mosquitto": "mosquitto", "mosquitto_sub": "mosquitto-clients", "mosquitto_pub": "mosquitto-clients",
    "mosquitto_passwd": "mosquitto", "nats-server": "nats-server", "espeak-ng": "espeak-ng",
    "gst-launch-1.0": "gstreamer1.0-tools", "gst-inspect-1.0": "gstreamer1.0-tools",
    "chromium": "chromium", "epmd": "rabbitmq-server", "rabbitmq-server": "rabbitmq-server",
    "systemd-nspawn": "systemd-container", "debootstrap": "debootstrap",
}
# programs of the base image every machine of this kind has (installed-python.txt), or that the
# tests only probe for and never need (a test about their absence)
BASE = {"python3", "systemd-analyze", "pg_ctl", "initdb", "postgres", "ip", "sh", "bash", "kill",
        "arecord",  # tests only assert the message when it is missing
        "chromium-browser",  # another distribution's name, looked up after `chromium`
        "psql", "git", "sed", "timeout", "nice", "taskset", "mount", "umount", "stat"}

_WHICH = re.compile(r"""which\(\s*["']([A-Za-z0-9_.+-]+)["']""")
_ARGV0 = re.compile(r"""(?:Popen|run|check_call|check_output)\(\s*\[\s*["']([A-Za-z0-9_.+-]+)["']""")


def _ci_packages() -> set[str]:
    text = (ROOT / ".ci" / "run").read_text()
    block = re.search(r"APT_PACKAGES=\((.*?)\)\n", text, re.S)
    assert block, "APT_PACKAGES not found in .ci/run"
    words = [line.split("#", 1)[0] for line in block.group(1).splitlines()]
    return set(" ".join(words).split())


def _programs() -> dict[str, str]:
    found: dict[str, str] = {}
    sources = [*ROOT.glob("tests/**/*.py"), *ROOT.glob("edgeinfer/testing/*.py"), *ROOT.glob("bench/*.py")]
    for path in sources:
        if path.name == Path(__file__).name:
            continue
        text = path.read_text()
        for pattern in (_WHICH, _ARGV0):
            for name in pattern.findall(text):
                found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def test_every_program_the_tests_call_is_installed_by_ci() -> None:
    packages = _ci_packages()
    programs = _programs()
    assert "gst-launch-1.0" in programs, "the scan found no gst-launch-1.0: it reads nothing"
    unknown = {p: where for p, where in programs.items()
               if p not in PACKAGE_OF and p not in BASE and not p.endswith(".py")}
    assert not unknown, f"programs with no Debian package named here (add it to PACKAGE_OF): {unknown}"
    missing = {p: PACKAGE_OF[p] for p in programs if p in PACKAGE_OF and PACKAGE_OF[p] not in packages}
    assert not missing, f".ci/run's APT_PACKAGES lacks the packages of {missing}"
