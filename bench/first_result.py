"""How soon ``edgeinfer run`` with one camera gives its first result: the camera read in a
capture process (the default) against in the daemon's own thread (as before capture processes:
``EDGEINFER_CAPTURE_IN_PROCESS=1``), alternating, in fresh processes.

    python3 bench/first_result.py [--repeats 5] [--no-write]

The camera: a 1280x720 MJPEG stream on loopback (``edgeinfer.testing.streams.MjpegServer``);
the model: BlazeFace with its cached backend decision (a first run measures it); the sink: a
JSON-lines file. The clock runs from the ``edgeinfer run`` process's start to the first result
line in the file. Medians; the results replace the ``first-result`` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section


def first_result(cfg: Path, out: Path, in_process: bool, timeout_s: float = 120.0) -> float:
    env = {**os.environ}
    env.pop("EDGEINFER_CAPTURE_IN_PROCESS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed by pip: modules byte-compiled
    if in_process:
        env["EDGEINFER_CAPTURE_IN_PROCESS"] = "1"
    out.unlink(missing_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while time.monotonic() - start < timeout_s:
            if out.exists() and out.read_bytes().count(b"\n"):
                return time.monotonic() - start
            if proc.poll() is not None:
                raise SystemExit(f"edgeinfer run ended with {proc.returncode}")
            time.sleep(0.01)
        raise SystemExit(f"no result within {timeout_s} s")
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from edgeinfer.testing.streams import MjpegServer

    times: dict[str, list[float]] = {"process": [], "thread": []}
    with tempfile.TemporaryDirectory(prefix="edgeinfer-first-") as tmp, \
            MjpegServer(width=1280, height=720, fps=15) as camera:
        cfg, out = Path(tmp) / "cam.json", Path(tmp) / "results.jsonl"
        cfg.write_text(json.dumps({
            "device_id": "bench",
            "runtime": {"state_dir": f"{tmp}/state", "cache_dir": f"{tmp}/cache"},
            "pipelines": [{"name": "cam", "source": {"type": "camera", "uri": camera.url},
                           "model": {"path": "blazeface"},
                           "task": {"type": "detect", "decoder": "blazeface"},
                           "detect": {"gate": "always"},
                           "sinks": [{"type": "jsonl", "path": str(out)}]}]}))
        first_result(cfg, out, False, 600.0)  # measures the backends, caches the decision
        first_result(cfg, out, True)  # and writes the bytecode of what either imports
        for i in range(args.repeats):
            order = ("process", "thread") if i % 2 == 0 else ("thread", "process")
            for which in order:
                times[which].append(first_result(cfg, out, which == "thread"))
    med = {k: statistics.median(v) for k, v in times.items()}
    body = "\n".join([
        "`edgeinfer run`, one 1280x720 MJPEG camera on loopback, BlazeFace on its cached "
        f"backend decision, every frame detected: seconds from the process's start to the first "
        f"result in a JSON-lines sink, {args.repeats} runs each, alternating, medians. "
        f"{machine_facts()}", "",
        "| camera read | first result, s (median) | runs |", "|---|---|---|",
        *(f"| {'in a capture process (default)' if k == 'process' else 'in the daemon (before)'}"
          f" | {med[k]:.2f} | {', '.join(f'{t:.2f}' for t in v)} |" for k, v in times.items()),
        "", f"Capture process / in the daemon: {med['process'] / med['thread']:.2f}."])
    print(body)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "first-result",
                      "First result of a camera", body,
                      f"python3 bench/first_result.py --repeats {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
