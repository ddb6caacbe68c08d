"""Regenerate every section of docs/benchmarks.md with one command.

    python3 bench/all.py [--only runtime,models] [--dry-run] [--keep-going]

Runs each bench script that exists, in the order of ``SCRIPTS``, with the arguments its
sections' "Regenerate:" lines in docs/benchmarks.md use (a script with several sections, such as
``pipeline.py`` per thread count, runs once per distinct line); a script with no section yet
runs with ``DEFAULTS``. Each script rewrites only its own sections; this one also refreshes the
machine line of the header. The lines are parsed, never handed to a shell: only
``python3 bench/<script>.py ARGS`` is accepted.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts

SCRIPTS = ("runtime", "pipeline", "mqtt", "models", "quantized", "ota", "backends", "startup",
           "memory", "e2e", "decode", "busy_boot", "cameras", "batching", "clip_remux")
# Used only while a script has no section in the doc yet.
DEFAULTS: dict[str, list[str]] = {
    "runtime": ["--rounds", "10", "--runs", "20"],
    "pipeline": ["--frames", "300", "--soak", "0", "--threads", "1"],
    "mqtt": ["--rounds", "5", "--messages", "20000"],
    "models": ["--rounds", "200", "--runs", "1", "--threads", "1,2"],
    "quantized": ["--rounds", "10", "--runs", "20", "--threads", "2"],
    "ota": [],
    "backends": ["--rounds", "8", "--runs", "5"],
    "startup": ["--repeats", "5"],
    "memory": ["--repeats", "3", "--shared-frames", "100"],
    "e2e": ["--frames", "300", "--repeats", "3"],
    "busy_boot": ["--repeats", "2"],
    "cameras": ["--cameras", "1,2,4,6,8,10,12"],
}
_REGENERATE = re.compile(r"^Regenerate: `python3? bench/(?P<script>[\w-]+)\.py(?P<args>[^`]*)`",
                         re.MULTILINE)
_MACHINE = re.compile(r"<!-- bench:machine:start -->.*?<!-- bench:machine:end -->", re.DOTALL)


def commands(doc_text: str, only: set[str] | None = None) -> list[list[str]]:
    """The argv of every run, in ``SCRIPTS`` order, for the scripts that exist."""
    found: dict[str, list[list[str]]] = {}
    for m in _REGENERATE.finditer(doc_text):
        args = shlex.split(m["args"])
        runs = found.setdefault(m["script"], [])
        if args not in runs:
            runs.append(args)
    out = []
    for name in SCRIPTS:
        if (only and name not in only) or not (ROOT / "bench" / f"{name}.py").is_file():
            continue
        for args in found.get(name) or [DEFAULTS[name]]:
            out.append([sys.executable, f"bench/{name}.py", *args])
    return out


def refresh_header() -> None:
    text = DOC.read_text()
    line = (f"<!-- bench:machine:start -->\n{machine_facts()} Last full run "
            f"{time.strftime('%Y-%m-%d')}.\n<!-- bench:machine:end -->")
    if _MACHINE.search(text):
        DOC.write_text(_MACHINE.sub(lambda _: line, text))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated script names, e.g. runtime,models")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--keep-going", action="store_true",
                        help="run the rest when one script fails")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    failed = []
    for argv in commands(DOC.read_text(), only):
        shown = " ".join(["python3", *argv[1:]])
        print(f"==> {shown}", flush=True)
        if args.dry_run:
            continue
        start = time.monotonic()
        code = subprocess.run(argv, cwd=ROOT, check=False).returncode
        print(f"<== {shown}: exit {code} after {time.monotonic() - start:.0f} s", flush=True)
        if code != 0:
            failed.append(shown)
            if not args.keep_going:
                break
    if not args.dry_run and only is None and not failed:
        refresh_header()
    for shown in failed:
        print(f"failed: {shown}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
