"""How many cameras: N RTSP cameras of a scripted scene through one process, per detection mode.

    python3 bench/cameras.py [--quick] [--scenes slow,fast,small] [--modes every,gated,...]
                             [--cameras 1,2,4,...] [--no-write]

The scene (``edgeinfer.testing.scripted_scene``): 1280x720 at 15 fps H.264, a still photograph
where the astronaut's face walks in, crosses a counting line, dwells in a zone and walks out
(twice, both directions, 60 s; moving about 18 % of the time), and a lamp flickering inside a
masked area; a 640x360 substream of the same frames. Encoded once (x264, cached under
``~/.cache/edgeinfer/bench``), served by GStreamer's RTSP server (``bench/_rtsp_files.py``,
a separate process, not counted) on loopback: every camera gets its own playback from the start.
That is the ``slow`` scene (the default). ``--scenes`` adds scenes of small, fast objects
(``edgeinfer.testing.fast_scene``, with sensor noise): ``fast``, 160 px faces (as the slow
scene's: nudenet-320n finds them all across a 720p frame) crossing the line 15 times in 60 s at
1-2 face widths per detection interval at ``detect.fps`` 5 (800-1600 px/s), alone, in opposite
pairs that pass each other on the line, and one behind another; ``small``, the same passes
with 85 px faces, which nudenet-320n does not find on the whole 720p frame (a crop, ``regions``,
finds some: that scene measures the detector more than the tracker). Their rows go to their
own section of ``docs/benchmarks.md``.

N pipelines (``Pipeline.from_config`` of one config, a pooled YOLOv8n-320 =
``nudenet-320n``, which finds the face) read the cameras over RTSP/TCP. Modes:

- ``every``: the detector on every frame (today's behaviour);
- ``gated``: motion-gated at ``detect.fps`` 5 with the lamp masked;
- ``regions``: gated, the detector sees the motion regions;
- ``batch``: gated + regions + ``model.batch: auto``;
- ``substream``: all that, detecting on the substream (``source.detect_uri``).

A mode whose config keys this edgeinfer does not know is skipped and named. Per mode, N = 1,
2, 4, 6, 8, ... until a run is not real time (bounded by ``--max-cameras``), each run over the
whole scene: CPU-seconds of this process per camera-minute (``getrusage``: decoding,
inference, tracking; the RTSP server excluded), latency from each scripted entry (the face
wholly in view) to the first result with a detection (capture wall clock of the entry frame to
the result), crossings counted against the script (right direction, within 1 s), detections in
the masked area (must be 0), detector runs per camera-second. Real time: the cameras' frames
are read at >= 95 % of 15 fps, <= 5 % are dropped between stages, and results lag their frame
by < 1 s (median).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts, write_section

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgeinfer" / "bench"
SYSTEM_PYTHON = "/usr/bin/python3"
MODEL = "nudenet-320n"
MODES = ("every", "gated", "regions", "batch", "substream")
SCENES = ("slow", "fast", "small")
SCENE_TITLES = {"slow": "slow (160 px face, 0.45 widths per interval)",
                "fast": "fast (160 px faces, 1-2 widths)", "small": "small (85 px faces, 1-2 widths)"}
NEEDS = {"every": (), "gated": ("detect", "motion"), "regions": ("detect", "motion"),
         "batch": ("detect", "motion", "batch"),
         "substream": ("detect", "motion", "batch", "detect_uri")}
TITLES = {"every": "every frame", "gated": "motion-gated, detect.fps 5",
          "regions": "gated + motion regions", "batch": "gated + regions + batching",
          "substream": "gated + regions + batching + substream"}
TITLES_BY_KEY = {"cameras-capture": "How many cameras: capture processes against one process"}
REALTIME_READ = 0.95  # of the camera's fps
REALTIME_DROP = 0.05
REALTIME_LAG_MS = 1000.0


# -- the scene and its server --------------------------------------------------------------------
def scene_files(which: str, quick: bool, sub: bool = True) -> tuple[Any, Path, Path]:
    """The scene ``which`` (``SCENES``) and its main stream and substream files (the main
    stream again for the substream unless ``sub``)."""
    from edgeinfer.testing.fast_scene import FastScene
    from edgeinfer.testing.scripted_scene import Scene

    length = "quick" if quick else "full"
    if which == "slow":
        scene: Any = Scene.quick() if quick else Scene.full()
        name = length
    else:
        px = 160 if which == "fast" else 85
        scene = FastScene.quick(face_px=px) if quick else FastScene.full(face_px=px)
        name = f"{which}2-{length}"  # 2: the script's version (a new one is a new file)
    main = scene.encode(CACHE / f"cameras-{name}-1280x720.mp4")
    if not sub:
        return scene, main, main
    return scene, main, scene.encode(CACHE / f"cameras-{name}-640x360.mp4", size=(640, 360))


class FileServer:
    """``bench/_rtsp_files.py`` under the system Python: ``/main`` and ``/sub``."""

    def __init__(self, main: Path, sub: Path) -> None:
        self.files = (main, sub)
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> FileServer:
        main, sub = self.files
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, str(ROOT / "bench" / "_rtsp_files.py"), "--mount", f"/main={main}",
             "--mount", f"/sub={sub}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.__exit__()
            raise SystemExit(f"the RTSP server did not start: {line}")
        self.port = int(line.split()[1])
        threading.Thread(target=lambda: [None for _ in self.proc.stdout or ()], daemon=True).start()
        return self

    def url(self, mount: str) -> str:
        return f"rtsp://127.0.0.1:{self.port}/{mount}"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


# -- config ----------------------------------------------------------------------------------------
def features() -> dict[str, str | None]:
    """Which of the issue's config keys this edgeinfer knows (``None``) or why not."""
    from edgeinfer.config import parse_config
    from edgeinfer.errors import ConfigError

    probes: dict[str, dict[str, Any]] = {
        "detect": {"detect": {"fps": 5, "gate": "always"}},
        "motion": {"motion": {"threshold": 25}},
        "batch": {"model": {"path": "m.onnx", "batch": "auto"}},
        "detect_uri": {"source": {"type": "camera", "uri": "rtsp://h/a",
                                  "detect_uri": "rtsp://h/b"}},
        "isolation": {"source": {"type": "camera", "uri": "rtsp://h/a", "isolation": "thread"}},
    }
    out: dict[str, str | None] = {}
    for key, extra in probes.items():
        p = {"name": "p", "model": {"path": "m.onnx"}, "source": {"type": "camera",
                                                                  "uri": "rtsp://h/a"},
             "task": {"type": "detect"}, **extra}
        try:
            parse_config(json.dumps({"pipelines": [p]}))
            out[key] = None
        except ConfigError as exc:
            out[key] = str(exc).splitlines()[0]
    return out


def config(mode: str, n: int, scene: Any, server: FileServer, state: str, probe: bool,
           isolation: str = "auto") -> Any:
    from edgeinfer.config import parse_config
    from edgeinfer.testing.scripted_scene import MASK

    have = features()
    pipelines = []
    for i in range(n):
        p: dict[str, Any] = {
            "name": f"cam{i}", "source": {"type": "camera", "uri": server.url("main"),
                                          **({"isolation": isolation} if have["isolation"]
                                             is None else {})},
            "model": {"path": MODEL, "probe": probe},
            "task": {"type": "detect", "decoder": "yolov8", "score_threshold": 0.3,
                     "classes": ["FACE_FEMALE", "FACE_MALE"],
                     "preprocess": {"size": [320, 320]}},
            "sinks": [],
            "track": {"high_threshold": 0.4, "new_track_threshold": 0.45},
            **scene.scene_config()}
        if mode == "every":
            if have["detect"] is None:
                p["detect"] = {"gate": "always", "fps": None}
        else:
            p["detect"] = {"fps": 5, "gate": "motion", "keepalive_s": 2.0,
                           "regions": mode != "gated", "stationary_after": 10}
            p["motion"] = {"mask": [[list(pt) for pt in MASK]]}
        if mode in ("batch", "substream"):
            p["model"]["batch"] = "auto"
        if mode == "substream":
            p["source"]["detect_uri"] = server.url("sub")
        pipelines.append(p)
    return parse_config(json.dumps({
        "device_id": "bench", "runtime": {"state_dir": state, "cache_dir": f"{state}/cache"},
        "pipelines": pipelines}))


# -- one run -------------------------------------------------------------------------------------
@dataclass
class Seen:
    """What one camera's results showed (appended from its emit thread)."""

    frames: dict[int, tuple[float, float, bool, bool]] = field(default_factory=dict)
    """index -> (capture wall, result wall, a face detected outside the mask, one inside)"""
    crossings: list[tuple[int, str]] = field(default_factory=list)

    def on_result(self, result: Any, scene: Any) -> None:
        size = (result.frame.width, result.frame.height)
        dets = result.task.detections or ()
        masked = [scene.in_mask(d.box, size) for d in dets]
        self.frames[result.frame.index] = (result.frame.wall, result.ts,
                                           not all(masked), any(masked))
        for e in result.events:
            if e.get("type") == "cross":
                self.crossings.append((int(e["frame"]), str(e["direction"])))


def score(seen: Seen, scene: Any) -> dict[str, Any]:
    """Crossings against the script, entry latencies, detections in the mask."""
    fps = scene.fps
    last = max(seen.frames, default=-1)
    # The stream's start on the wall clock: the earliest delivery of frames read at the
    # stream's pace (FFmpeg hands the frames it buffered while opening in a burst).
    late = [w - i / fps for i, (w, *_) in seen.frames.items() if i >= 3 * fps]
    epoch = min(late) if late else 0.0
    expected = [c for c in scene.crossings if c.frame <= last - fps]
    found = list(seen.crossings)
    matched = 0
    for c in expected:
        for j, (frame, direction) in enumerate(found):
            if direction == c.direction and abs(frame - c.frame) <= fps:
                matched += 1
                del found[j]
                break
    # A crossing past the cut-off found anyway is no extra.
    late = [c for c in scene.crossings if c.frame > last - fps]
    found = [f for f in found if not any(f[1] == c.direction and abs(f[0] - c.frame) <= fps
                                         for c in late)]
    latencies = []
    detected = sorted(i for i, (*_, face, _m) in seen.frames.items() if face)
    for k in scene.entries:
        if k > last - fps:
            continue
        first = next((i for i in detected if i >= k), None)
        if first is None:
            latencies.append(float("inf"))
            continue
        captured = seen.frames[k][0] if k in seen.frames else epoch + k / fps
        latencies.append(seen.frames[first][1] - captured)
    return {"crossings_expected": len(expected), "crossings_matched": matched,
            "crossings_extra": len(found), "entry_latency_s": latencies,
            "in_mask": sum(1 for *_, m in seen.frames.values() if m)}


def cpu_s(pipes: list[Any]) -> float:
    """CPU-seconds of this process and of the cameras' capture processes (each read from
    ``/proc``: a running child is not in ``RUSAGE_CHILDREN``)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    total = r.ru_utime + r.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for p in pipes:
        pid = getattr(p.source, "pid", None)
        if pid is None:
            continue
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def pss_mb(pipes: list[Any]) -> float:
    """PSS of this process and the cameras' capture processes (``smaps_rollup``; the RTSP
    server, a child too, left out)."""
    pids = [os.getpid(), *(pid for p in pipes if (pid := getattr(p.source, "pid", None)))]
    total = 0.0
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1]) / 1024
                break
    return total


def counters(pipes: list[Any]) -> list[dict[str, float]]:
    return [{"read": p.source.stats.frames, "dropped": p.stats.dropped_queue,
             "infer": p.stats.infer.count, "t": time.monotonic()} for p in pipes]


def run(mode: str, n: int, scene: Any, server: FileServer, state: str, probe: bool,
        which: str = "slow", isolation: str = "auto") -> dict[str, Any]:
    from edgeinfer.pipeline import Pipeline

    cfg = config(mode, n, scene, server, state, probe, isolation)
    seen = [Seen() for _ in range(n)]
    pipes = [Pipeline.from_config(cfg, name=f"cam{i}",
                                  on_result=lambda r, s=seen[i]: s.on_result(r, scene))
             for i in range(n)]
    length = scene.frames / scene.fps
    try:
        for p in pipes:
            p.start()
        started = time.monotonic()
        # Warm: every camera read past FFmpeg's opening burst (2 s of frames at once).
        deadline = started + 30
        while time.monotonic() < deadline and any(
                max(s.frames, default=-1) < 3 * scene.fps for s in seen):
            time.sleep(0.1)
        before, cpu0 = counters(pipes), cpu_s(pipes)
        end = started + length - 3.0  # the server sends the first ~2 s at once: ends early
        while time.monotonic() < end and not any(p.error for p in pipes):
            time.sleep(0.2)
        after, cpu1 = counters(pipes), cpu_s(pipes)
        memory = pss_mb(pipes)
        lags = [p.stats.latency.summary()["p50"] for p in pipes]
    finally:
        for p in pipes:
            p.close()
    errors = [f"{p.name}: {p.error}" for p in pipes if p.error is not None]
    window = after[0]["t"] - before[0]["t"]
    read = [(a["read"] - b["read"]) / window for a, b in zip(after, before)]
    dropped = [(a["dropped"] - b["dropped"]) / max(1.0, a["read"] - b["read"])
               for a, b in zip(after, before)]
    infer = [(a["infer"] - b["infer"]) / window for a, b in zip(after, before)]
    scores = [score(s, scene) for s in seen]
    realtime = (not errors and window > 5 and min(read) >= REALTIME_READ * scene.fps
                and max(dropped) <= REALTIME_DROP and max(lags) < REALTIME_LAG_MS)
    lat = [x for s in scores for x in s["entry_latency_s"]]
    return {
        "scene": which, "mode": mode, "isolation": isolation, "cameras": n,
        "window_s": round(window, 1), "realtime": realtime,
        "inferred_per_s": sum(infer), "pss_mb": memory,
        "cpu_s_per_camera_min": (cpu1 - cpu0) / n / (window / 60),
        "read_fps_min": min(read), "dropped_max": max(dropped), "lag_ms_max": max(lags),
        "detector_runs_per_s": sum(infer) / n,
        "crossings": [sum(s["crossings_matched"] for s in scores),
                      sum(s["crossings_expected"] for s in scores),
                      sum(s["crossings_extra"] for s in scores)],
        "entry_latency_s_max": max(lat) if lat else None, "entries": len(lat),
        "in_mask": sum(s["in_mask"] for s in scores), "errors": errors,
        "load": os.getloadavg()[0]}


def pick_backend(scene: Any, server: FileServer, state: str) -> str:
    """Let the backend selector measure once (cached in ``state``) before anything is timed."""
    from edgeinfer.pipeline import Pipeline

    p = Pipeline.from_config(config("every", 1, scene, server, state, True), name="cam0")
    p.start()
    deadline = time.monotonic() + 300
    try:
        while p.model.selection is None or p.model.selecting:
            if time.monotonic() > deadline:
                raise SystemExit("the backend probe did not finish in 300 s")
            time.sleep(0.2)
        return str(p.model.selection.get("picked", p.model.provider))
    finally:
        p.close()


def model_alone_fps(scene: Any, server: FileServer, state: str, seconds: float = 8.0) -> float:
    """What the model sustains alone on its pick (the cached decision), inferences a second on
    one 720p frame preprocessed once: the ceiling the pipelines are measured against."""
    import numpy as np

    from edgeinfer.frames import Frame
    from edgeinfer.pipeline import Pipeline

    p = Pipeline.from_config(config("every", 1, scene, server, state, True, "thread"),
                             name="cam0")
    try:
        frame = Frame(0, time.monotonic(), time.time(),
                      np.random.default_rng(0).integers(0, 255, (720, 1280, 3), np.uint8))
        feeds, _ = p.task.preprocess(frame)
        for _ in range(5):
            p.model.run(feeds)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            p.model.run(feeds)
            n += 1
        return n / (time.perf_counter() - t0)
    finally:
        p.close()


def decode_alone_cpu(scene: Any, server: FileServer) -> float:
    """CPU-seconds a camera-minute of reading and decoding one camera alone (the same reader
    as the pipelines', in this process): what gating is measured against."""
    from edgeinfer.config.pipeline import CameraSource as CameraConfig
    from edgeinfer.sources import open_source

    source = open_source(CameraConfig(uri=server.url("main"), isolation="thread"))
    length = scene.frames / scene.fps
    with source:
        frames = iter(source)
        started = time.monotonic()
        for frame in frames:  # past FFmpeg's opening burst, as the pipelines' runs
            if frame.index >= 3 * scene.fps or time.monotonic() - started > 30:
                break
        c0, t0 = cpu_s([]), time.monotonic()
        end = started + length - 3.0
        for _ in frames:
            if time.monotonic() >= end:
                break
        c1, t1 = cpu_s([]), time.monotonic()
    return (c1 - c0) / ((t1 - t0) / 60)


# -- report ----------------------------------------------------------------------------------------
def row(r: dict[str, Any]) -> str:
    m, e, x = r["crossings"]
    lat = r["entry_latency_s_max"]
    lat_s = "-" if lat is None else ("never" if lat == float("inf") else f"{lat:.2f}")
    return (f"| {r['scene']} | {TITLES[r['mode']]} | {r['isolation']} | {r['cameras']} | "
            f"{'yes' if r['realtime'] else 'no'} | "
            f"{r['cpu_s_per_camera_min']:.1f} | {r['detector_runs_per_s']:.1f} | "
            f"{m}/{e}{f' (+{x} extra)' if x else ''} | {lat_s} | {r['in_mask']} | "
            f"{r['read_fps_min']:.1f} / {100 * r['dropped_max']:.1f} % / "
            f"{r['lag_ms_max']:.0f} | {r['load']:.1f} |")


def cpu_budget(r: dict[str, Any], cores: int, fps: float) -> str:
    """How many cameras like this one the cores' CPU-seconds allow. A run that dropped frames
    spent less than a full rate costs: scaling its CPU by the detector runs it missed gives a
    bound the other way (too high: decoding was not skipped), so a range."""
    per_min = r["cpu_s_per_camera_min"]
    most = cores * 60 / per_min
    if r["dropped_max"] <= REALTIME_DROP or r["detector_runs_per_s"] <= 0:
        return f"{most:.1f}"
    least = most * min(1.0, r["detector_runs_per_s"] / fps)
    return f"{least:.1f}-{most:.1f} (frames were dropped)"


HEAD = ("| scene | mode | capture | cameras | real time | CPU-s per camera-minute "
        "| detector runs per camera-s | "
        "crossings right (of script) | worst entry -> first result, s | detections in the mask "
        "| read fps min / dropped max / lag p50 ms max | load avg |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|")


def cores_scaling(args: argparse.Namespace) -> int:
    """The largest N of gated cameras held real time pinned to one CPU, and on all of them."""
    every = sorted(os.sched_getaffinity(0))
    held: dict[int, int] = {}
    rows: list[dict[str, Any]] = []
    for cpus in ([every[0]], every):
        proc = subprocess.run(
            [sys.executable, __file__, "--modes", "gated", "--cameras", args.cameras,
             "--isolation", args.isolation.split(",")[-1], "--json", "--no-write",
             "--cpus", ",".join(map(str, cpus))],
            capture_output=True, text=True, check=False)
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not got:
            raise SystemExit(f"the run on CPUs {cpus} failed: {proc.stderr[-2000:]}")
        rows.extend({**r, "cpus": len(cpus)} for r in got)
        held[len(cpus)] = max((r["cameras"] for r in got if r["realtime"]), default=0)
    one, all_ = held[1], held[len(every)]
    body = "\n".join([
        f"Motion-gated 720p cameras (the slow scene, detect.fps 5, capture: "
        f"{args.isolation.split(',')[-1]}) held real time pinned to 1 CPU and on all "
        f"{len(every)} (`--cpus`: the pipelines, capture processes and the RTSP server pinned "
        f"alike). {machine_facts()}", "",
        "| CPUs | cameras | real time | CPU-s per camera-minute | read fps min / dropped max "
        "/ lag p50 ms max |", "|---|---|---|---|---|",
        *(f"| {r['cpus']} | {r['cameras']} | {'yes' if r['realtime'] else 'no'} | "
          f"{r['cpu_s_per_camera_min']:.1f} | {r['read_fps_min']:.1f} / "
          f"{100 * r['dropped_max']:.1f} % / {r['lag_ms_max']:.0f} |" for r in rows), "",
        f"Largest real-time N: {one} on 1 CPU, {all_} on {len(every)}: "
        + (f"{all_ / one:.2f}x" if one else "no camera held on 1 CPU") + " (target >= 1.8x)."])
    print(body)
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "cameras-cores",
                      "How many cameras: cores", body,
                      f"python3 bench/cameras.py --cores-scaling --cameras {args.cameras} "
                      f"--isolation {args.isolation}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="11 s scene (8 s for fast ones), 1 camera, one mode (the most complete "
                    "this build has, unless --modes); no backend probe")
    ap.add_argument("--scenes", default="slow", help=f"of {','.join(SCENES)}; default: slow")
    ap.add_argument("--modes", default=None, help=f"default: {','.join(MODES)}")
    ap.add_argument("--cameras", default="1,2,4,6,8,10,12",
                    help="N to try in order; a mode stops at its first N not real time")
    ap.add_argument("--keep-going", action="store_true",
                    help="try every N even after one that is not real time")
    ap.add_argument("--isolation", default="process",
                    help="where cameras are read: process, thread, or both (thread,process) "
                    "to compare in one run")
    ap.add_argument("--cpus", default=None,
                    help="run on these CPUs only (e.g. 0, or 0,1), capture processes and the "
                    "RTSP server included: how the cameras held scale with cores")
    ap.add_argument("--cores-scaling", action="store_true",
                    help="gated cameras held real time on one CPU and on all, in one run (two "
                    "runs of this script, each pinned with --cpus)")
    ap.add_argument("--key", default=None,
                    help="the docs/benchmarks.md section to write (default: cameras, or "
                    "cameras-fast for the fast scenes)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    args = ap.parse_args()
    if args.cores_scaling:
        return cores_scaling(args)
    if args.cpus is not None:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    scenes = args.scenes.split(",")
    if unknown := [x for x in scenes if x not in SCENES]:
        raise SystemExit(f"unknown scene {', '.join(unknown)}: choose from {', '.join(SCENES)}")
    # Loopback RTSP over TCP: interleaved, no UDP loss when the box is busy (NVRs do the same).
    os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "rtsp_transport;tcp")
    have = features()
    missing = {m: [k for k in NEEDS[m] if have[k] is not None] for m in MODES}
    if args.modes is None:
        have_modes = [m for m in MODES if not missing[m]]
        args.modes = have_modes[-1] if args.quick else ",".join(MODES)
        if args.quick:
            print(f"quick: mode {args.modes}, the most complete this edgeinfer has"
                  + "".join(f"; {m} needs {', '.join(k)}" for m, k in missing.items() if k),
                  file=sys.stderr)
    counts = [1] if args.quick else [int(c) for c in args.cameras.split(",")]
    results: list[dict[str, Any]] = []
    skipped: list[str] = []
    picked = "not measured (--quick)"
    alone = decode = 0.0
    with tempfile.TemporaryDirectory(prefix="edgeinfer-cams-") as tmp:
        state = tmp if args.quick else str(CACHE / "cameras-state")
        for k, which in enumerate(scenes):
            scene, main_file, sub_file = scene_files(which, args.quick,
                                                     sub="substream" in args.modes)
            with FileServer(main_file, sub_file) as server:
                if k == 0 and not args.quick:
                    picked = pick_backend(scene, server, state)
                for mode in args.modes.split(","):
                    if missing[mode]:
                        if k == 0:
                            skipped.append(f"{mode} (this edgeinfer lacks: "
                                           f"{', '.join(missing[mode])})")
                            print(f"skip {mode}: needs {', '.join(missing[mode])}",
                                  file=sys.stderr)
                        continue
                    for isolation in args.isolation.split(","):
                        for n in counts:
                            r = run(mode, n, scene, server, state, not args.quick, which,
                                    isolation)
                            results.append(r)
                            print(json.dumps(r) if args.json else row(r), flush=True)
                            if not r["realtime"] and not args.keep_going:
                                break
                if k == 0 and not args.quick and not args.json:
                    if "every" in args.modes.split(","):
                        alone = model_alone_fps(scene, server, state)
                    decode = decode_alone_cpu(scene, server)
    every = [r for r in results if r["mode"] == "every"]
    ratios = [f"{r['cameras']} camera(s), {r['isolation']}: "
              f"{r['inferred_per_s'] / min(15.0 * r['cameras'], alone):.2f}" for r in every
              if alone]
    gated = [f"{TITLES[r['mode']]}, {r['isolation']}, {r['cameras']} camera(s): "
             f"{r['cpu_s_per_camera_min'] / decode:.2f}" for r in results
             if r["mode"] != "every" and r["scene"] == scenes[0] and decode]
    memory = [f"{TITLES[r['mode']]}, {r['cameras']} camera(s): "
              f"{r['pss_mb']:.0f} MB / {t['pss_mb']:.0f} MB = {r['pss_mb'] / t['pss_mb']:.2f}"
              for r in results for t in results
              if r["isolation"] == "process" and t["isolation"] == "thread"
              and (r["scene"], r["mode"], r["cameras"]) == (t["scene"], t["mode"], t["cameras"])]
    runs = list(dict.fromkeys((r["scene"], r["mode"], r["isolation"]) for r in results))
    best = {sm: max((r["cameras"] for r in results
                     if (r["scene"], r["mode"], r["isolation"]) == sm and r["realtime"]),
                    default=0) for sm in runs}
    cores = len(os.sched_getaffinity(0))
    budget = {sm: cpu_budget(next(r for r in results
                                  if (r["scene"], r["mode"], r["isolation"]) == sm), cores,
                             15.0) for sm in runs}
    name = {sm: f"{TITLES[sm[1]]}, {sm[2]}" + (f" ({sm[0]})" if scenes != ["slow"] else "")
            for sm in runs}
    fast = [x for x in scenes if x != "slow"]
    crossed = {x: [r["crossings"] for r in results if r["scene"] == x and r["mode"] != "every"]
               for x in fast}
    body = "\n".join([
        *(["60 s scripted scene (face walks in, crosses the line, dwells in the zone, walks out; "
           "moving 18 % of the time; a flickering lamp in a masked area)"
           + (": the slow scene" if fast else "") + "."] if "slow" in scenes else []),
        *(["Scenes of small, fast objects (`edgeinfer.testing.fast_scene`, 60 s each, 15 "
           "crossings of the line at 1-2 face widths per detection interval at detect.fps 5, "
           "alone, in opposite pairs passing each other on the line, one behind another; the "
           "lamp; Gaussian sensor noise, sigma 4 grey levels): "
           + "; ".join(SCENE_TITLES[x] for x in fast) + "."] if fast else []),
        "1280x720 at 15 fps H.264, served over RTSP/TCP on loopback by GStreamer's RTSP server "
        f"(its CPU not counted); N pipelines in one process on a pooled {MODEL} (YOLOv8n-320), "
        f"backend pick: {picked}. Each N runs the whole scene; a mode stops at its first N "
        f"that is not real time. {machine_facts()}", "", HEAD, *(row(r) for r in results), "",
        "Largest real-time N: " + (", ".join(f"{name[sm]}: {n}" for sm, n in best.items())
                                   or "none measured") + ". "
        f"Cameras the CPU alone would allow ({cores} cores x 60 CPU-s a minute over one "
        "camera's CPU-s at the smallest N): "
        + (", ".join(f"{name[sm]}: {b}" for sm, b in budget.items()) or "-") + ".",
        *([f"Every frame detected: frames inferred a second over the lesser of the cameras' "
           f"15 fps each and what the model sustains alone on its pick ({alone:.1f} "
           f"inferences/s, measured in this run): " + "; ".join(ratios) + "."] if ratios
          else []),
        *([f"CPU per camera over decoding that camera's stream alone ({decode:.1f} CPU-s a "
           "camera-minute, measured in this run): " + "; ".join(gated) + "."] if gated
          else []),
        *(["Memory of the whole process tree (PSS: this process and the capture processes), "
           "capture processes / one process: " + "; ".join(memory) + "."] if memory else []),
        *(["Gated crossings right, all gated modes and N together: " + "; ".join(
            f"{x}: {sum(c[0] for c in cs)} of {sum(c[1] for c in cs)}, "
            f"{sum(c[2] for c in cs)} extra" for x, cs in crossed.items() if cs) + "."]
          if any(crossed.values()) else []),
        *([f"Not measured (feature not in this build): {'; '.join(skipped)}."] if skipped
          else []),
        *([f"The machine was busy with other work (load average at least {busiest:.1f} on "
           f"{cores} CPUs, this run's own load included): frames dropped for want of CPU, so "
           "the real-time verdicts are pessimistic and CPU per camera-minute is at the detector "
           "rate reached."] if (busiest := min((r["load"] for r in results), default=0.0))
          > cores + 1 else [])])
    print(body)
    if not args.no_write and not args.quick:
        key, title = (("cameras-fast", "Small, fast objects: counting with motion gating")
                      if fast else ("cameras", "How many cameras"))
        if args.key is not None:
            key, title = args.key, TITLES_BY_KEY.get(args.key, title)
        write_section(ROOT / "docs" / "benchmarks.md", key, title, body,
                      f"python3 bench/cameras.py --scenes {args.scenes} --modes {args.modes} "
                      f"--cameras {args.cameras} --isolation {args.isolation}"
                      + (f" --key {args.key}" if args.key else "")
                      + (" --keep-going" if args.keep_going else ""))
    return 0 if all(not r["errors"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
