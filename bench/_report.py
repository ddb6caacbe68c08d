"""Shared by the bench scripts: machine facts and writing one section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

_HEADER = """# Benchmarks

Every figure is a ratio measured in one run of one script on one machine (this machine is
shared and noisy, so absolute numbers are context, ratios are the result). Each section says
the command that regenerates it; a script rewrites only its own section.
"""


def machine_facts() -> str:
    import numpy
    import onnxruntime

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"Machine: {platform.machine()}, {cpu or platform.processor()}, "
            f"{os.cpu_count()} CPUs; Python {platform.python_version()}, "
            f"onnxruntime {onnxruntime.__version__}, numpy {numpy.__version__}.")


def write_section(doc: Path, key: str, title: str, body: str, command: str) -> None:
    """Replace (or append) the section between ``<!-- bench:KEY -->`` markers in ``doc``."""
    start, end = f"<!-- bench:{key}:start -->", f"<!-- bench:{key}:end -->"
    stamp = time.strftime("%Y-%m-%d")
    section = (f"{start}\n## {title}\n\nRegenerate: `{command}` (last run {stamp}).\n\n"
               f"{body}\n{end}")
    text = doc.read_text() if doc.exists() else _HEADER
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else \
        text.rstrip("\n") + "\n\n" + section + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
