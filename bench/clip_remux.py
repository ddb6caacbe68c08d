"""Encoder CPU per event clip: cut from the camera's own H.264 packets (remux) against
re-encoding the kept frames (VP8, what ``clips.format: auto`` gives with PyPI's OpenCV, and
``mp4v``, the cheap one), measured in one run on the same frames and events.

    python3 bench/clip_remux.py [--size 1280x720] [--fps 15] [--clips 3] [--json] [--no-write]

A real RTSP camera on loopback (GStreamer's RTSP server, ``x264enc`` test pattern, a keyframe a
second) is read by the PyAV camera; every frame is offered to three recorders at once
(``clips.remux: true``; ``remux: false`` with ``format: vp8``; with ``format: mp4v``; the
defaults otherwise: ``pre_s`` 3, ``post_s`` 5, ``fps`` 10, ``max_width`` 960), and the same
``enter`` events go to each. The clip writer thread's CPU time (``time.thread_time``) per clip
is what each recorder reports (``remux_cpu_s``, ``encode_cpu_s``); the RTSP server's encoding
is another process and not counted. Writes a section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _report import machine_facts, write_section

from edgeinfer.analytics.recorder import Recorder
from edgeinfer.config.analytics import ClipConfig, RecordConfig, RetentionConfig
from edgeinfer.config.pipeline import CameraSource as CameraConfig
from edgeinfer.sources import open_source
from edgeinfer.testing.streams import RtspServer

WAYS = {"remux (camera's H.264 packets)": {"remux": True},
        "re-encode VP8/WebM": {"remux": False, "format": "vp8"},
        "re-encode mp4v/MP4": {"remux": False, "format": "mp4v"}}


def run(width: int, height: int, fps: int, clips: int) -> dict[str, Any]:
    cfg = ClipConfig()  # pre_s 3, post_s 5
    gap = cfg.pre_s + cfg.post_s + 1.0
    with tempfile.TemporaryDirectory() as tmp, \
            RtspServer(width=width, height=height, fps=fps, codec="h264", gop=fps) as server:
        source = open_source(CameraConfig(uri=server.url, open_timeout_s=10))
        assert source.packets is not None, "PyAV is needed: pip install 'edgeinfer[rtsp]'"
        recs = {name: Recorder(f"r{i}", RecordConfig(
            clips=ClipConfig(**opts), snapshots=False,
            retention=RetentionConfig(min_free_mb=1)), Path(tmp) / f"r{i}")
            for i, (name, opts) in enumerate(WAYS.items())}
        for rec in recs.values():
            rec.use_packets(source.packets)
            rec.start()
        watchdog = threading.Timer(gap * (clips + 1) + 60, source.stop)
        watchdog.start()
        made = 0
        try:
            with source:
                first = None
                for frame in source:
                    first = frame.ts if first is None else first
                    if made < clips and frame.ts - first >= cfg.pre_s + 0.5 + made * gap:
                        made += 1
                        for rec in recs.values():
                            rec.on_event(f"e{made}", "enter", 1, frame.ts)
                    for rec in recs.values():
                        rec.offer(frame, frame.ts, [])
                    if frame.ts - first >= cfg.pre_s + 0.5 + (clips - 1) * gap + cfg.post_s + 0.5:
                        break
        finally:
            watchdog.cancel()
            for rec in recs.values():
                rec.close(60)
        rows = []
        for name, rec in recs.items():
            s = rec.stats()
            files = sorted((rec.directory / "clips").glob("*"))
            cpu = s["remux_cpu_s"] + s["encode_cpu_s"]
            rows.append({"way": name, "clips": s["clips_written"],
                         "cpu_ms_per_clip": 1000 * cpu / max(1, s["clips_written"]),
                         "kb_per_clip": sum(f.stat().st_size for f in files) / 1024 / max(
                             1, len(files)),
                         "size": f"{width}x{height}" if "remux" in name else
                                 f"{min(width, 960)}x{round(height * min(1, 960 / width))}"})
    return {"width": width, "height": height, "fps": fps, "clip_s": cfg.pre_s + cfg.post_s,
            "rows": rows}


def table(res: dict[str, Any]) -> str:
    lines = [f"Camera: H.264 {res['width']}x{res['height']} at {res['fps']} fps over RTSP "
             f"(loopback, GStreamer's server), clips of {res['clip_s']:g} s (`pre_s` 3 + "
             "`post_s` 5; a remuxed clip starts at the keyframe before the pre-roll). CPU: the "
             "clip writer thread's, per clip.", "",
             "| clip made by | clips | writer CPU per clip (ms) | clip size | KiB per clip |",
             "|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['way']} | {r['clips']} | {r['cpu_ms_per_clip']:.1f} | {r['size']} | "
                     f"{r['kb_per_clip']:.0f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--fps", type=int, default=15)
    ap.add_argument("--clips", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    res = run(width, height, args.fps, args.clips)
    body = table(res)
    print(json.dumps(res, indent=1) if args.json else body)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "clip-remux",
                      "Event clips: remux against re-encode",
                      machine_facts() + "\n\n" + body, "python3 bench/clip_remux.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
