"""Cost of scene analytics in a real pipeline: frames/s with and without, the pre-roll buffer's
memory, and a 10,000-frame soak.

    python3 bench/analytics_pipeline.py [--quick] [--rounds 5] [--frames 300] [--soak 10000]
                                        [--seed 0] [--json]

1. Throughput: a 1280x720, 30 fps video made from real photographs (a person and a cat cut from
   scikit-image's photographs slide across a third, the cat diagonally, so both cross a vertical
   line and the cat a horizontal one every few seconds) goes through video (unpaced) ->
   letterbox -> YOLOv8n-320 (onnxruntime CPU, 1 thread, no probe) -> decode + NMS -> jsonl,
   with analytics off and on (track + 2 zones + 2 lines + record with snapshots and clips).
   Rounds alternate the order (off/on, on/off); the result is the median of the per-round
   on/off ratios of frames/s, with their range. Frames/s counts from ``start()`` to the last
   result (closing, which flushes clips still collecting, is not counted). The emit thread's
   per-frame ``post`` latency (decode + NMS, plus analytics when on) and the process's CPU per
   frame (every thread, the recorder's encoder and writer included) say where the time goes.
2. Pre-roll memory: 1080p frames (the same scene, upscaled photographs) offered at 30 fps of
   scene clock to a ``Recorder`` with ``clips.fps`` 10 and ``pre_s`` 3 / 5 / 10, at the default
   ``max_width`` (1280) and at full size; the ring's encoded bytes against raw frames
   (1920 x 1080 x 3 bytes each), and the process's resident memory growth.
3. Soak: ``--soak`` frames of a synthetic detection stream (objects crossing the frame every
   few seconds, seeded jitter) on real 720p frames through ``SceneAnalytics.process`` with
   record, clips and a small retention limit, paced so the encoder is not outrun (as a 30 fps
   camera would be); resident memory (psutil) and ``tracemalloc`` sampled every tenth of the
   run; slopes over the last 80 % in MiB per 1,000 frames; buffer bytes and files on disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts

FPS = 30.0
SIZE = (1280, 720)
MIB = 1024 * 1024
ZONES = [{"name": "left", "points": [[0.02, 0.2], [0.4, 0.2], [0.4, 0.9], [0.02, 0.9]]},
         {"name": "right", "points": [[0.6, 0.2], [0.98, 0.2], [0.98, 0.9]]}]
LINES = [{"name": "mid", "points": [[0.5, 0.0], [0.5, 1.0]]},
         {"name": "row", "points": [[0.0, 0.3], [1.0, 0.3]]}]


# -- a scene made of real photographs ---------------------------------------------------------

def _photo(name: str) -> np.ndarray:
    import cv2

    from edgeinfer import samples

    path = next(p for p in samples.sample_images() if p.stem == name)
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise SystemExit(f"cannot read the sample photograph {path}")
    return np.asarray(image)


class Scene:
    """Frames of a person (the astronaut) moving left to right and a cat (chelsea) moving right
    to left and down, over the Hubble deep field, each crossing every ``period_s`` seconds."""

    def __init__(self, size: tuple[int, int], fps: float = FPS, period_s: float = 4.0) -> None:
        import cv2

        w, h = size
        self.size, self.fps, self.period = size, fps, period_s
        self.bg = cv2.resize(_photo("hubble_deep_field"), (w, h), interpolation=cv2.INTER_LINEAR)
        ph = int(h * 0.8)
        self.person = cv2.resize(_photo("astronaut"), (ph, ph), interpolation=cv2.INTER_AREA)
        ch = int(h * 0.6)
        self.other = cv2.resize(_photo("astronaut")[:, ::-1], (ch, ch),
                                interpolation=cv2.INTER_AREA)

    def frame(self, i: int) -> np.ndarray:
        w, h = self.size
        t = i / self.fps
        image = self.bg.copy()
        u = (t / self.period) % 1.0
        _paste(image, self.person, int(u * (w + self.person.shape[1])) - self.person.shape[1],
               int(h * 0.15))
        v = (t / (self.period * 1.3) + 0.5) % 1.0
        _paste(image, self.other, w - int(v * (w + self.other.shape[1])), int(h * 0.3 * v))
        return image


def _paste(image: np.ndarray, obj: np.ndarray, x: int, y: int) -> None:
    h, w = image.shape[:2]
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + obj.shape[1], w), min(y + obj.shape[0], h)
    if x1 > x0 and y1 > y0:
        image[y0:y1, x0:x1] = obj[y0 - y:y1 - y, x0 - x:x1 - x]


def write_video(path: Path, frames: int) -> Path:
    import cv2

    scene = Scene(SIZE)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, SIZE)
    for i in range(frames):
        writer.write(scene.frame(i))
    writer.release()
    return path


# -- 1. throughput, analytics off and on ------------------------------------------------------

def pipeline_config(video: Path, state: Path, analytics: bool, clip_format: str) -> Any:
    from edgeinfer.config import parse_config

    pc: dict[str, Any] = {
        "name": "bench",
        "source": {"type": "video", "uri": str(video)},
        "model": {"path": "nudenet-320n", "threads": 1, "providers": "cpu", "probe": False},
        "task": {"type": "detect", "decoder": "yolov8", "score_threshold": 0.2,
                 "preprocess": {"size": [320, 320]}},
        "sinks": [{"type": "jsonl", "path": str(state / "out.jsonl")}],
    }
    if analytics:
        # The catalog's YOLOv8n-320 is a face detector scoring these faces 0.2-0.7, with
        # two classes that swap from frame to frame: tracking thresholds to match.
        track = {"high_threshold": 0.25, "new_track_threshold": 0.3, "per_class": False}
        pc.update(track=track, zones=ZONES, lines=LINES, record={
            "clips": {"pre_s": 3, "post_s": 3, "fps": 10, "format": clip_format},
            "retention": {"max_mb": 50, "max_age_h": None, "min_free_mb": 10}})
    return parse_config(json.dumps({"runtime": {"state_dir": str(state)}, "pipelines": [pc]}))


def run_pipeline(config: Any) -> dict[str, Any]:
    from edgeinfer.pipeline import Pipeline

    last = [0.0, 0.0]

    def on_result(_result: Any) -> None:
        last[0], last[1] = time.perf_counter(), time.process_time()

    p = Pipeline.from_config(config, on_result=on_result)
    cpu0, t0 = time.process_time(), time.perf_counter()
    p.run()
    n = p.stats.processed
    snap = p.snapshot()
    out = {"fps": n / (last[0] - t0), "cpu_ms_per_frame": (last[1] - cpu0) / n * 1000,
           "post": snap["latency_ms"]["post"], "infer": snap["latency_ms"]["infer"],
           "frames": n, "events": p.stats.events}
    if p.analytics is not None:
        media = p.analytics.stats()["media"]
        out["media"] = {k: media[k] for k in ("kept", "encoded", "dropped_queue",
                                              "snapshots_written", "clips_written",
                                              "clip_format")}
    return out


def throughput(video: Path, tmp: Path, rounds: int, clip_format: str) -> dict[str, Any]:
    configs = {mode: pipeline_config(video, tmp / mode, mode == "on", clip_format)
               for mode in ("off", "on")}
    for mode in ("off", "on"):  # warm-up: model file, OpenCV, the clip format probe
        run_pipeline(configs[mode])
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for r in range(rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            runs[mode].append(run_pipeline(configs[mode]))
    ratios = [on["fps"] / off["fps"] for on, off in zip(runs["on"], runs["off"], strict=True)]

    def med(mode: str, *keys: str) -> float:
        values = []
        for run in runs[mode]:
            v: Any = run
            for k in keys:
                v = v[k]
            values.append(float(v))
        return round(statistics.median(values), 3)

    return {
        "rounds": rounds, "frames": runs["on"][0]["frames"],
        "ratio": round(statistics.median(ratios), 3),
        "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
        "ratios": [round(x, 3) for x in ratios],
        **{mode: {"fps": med(mode, "fps"), "cpu_ms_per_frame": med(mode, "cpu_ms_per_frame"),
                  "post_p50_ms": med(mode, "post", "p50"), "post_p99_ms": med(mode, "post", "p99"),
                  "post_mean_ms": med(mode, "post", "mean"),
                  "infer_p50_ms": med(mode, "infer", "p50")} for mode in ("off", "on")},
        "events_per_run": runs["on"][-1]["events"], "media_last_run": runs["on"][-1]["media"],
    }


# -- 2. pre-roll buffer memory ----------------------------------------------------------------

def preroll(tmp: Path, pre_values: list[float]) -> list[dict[str, Any]]:
    from edgeinfer.analytics.recorder import Recorder
    from edgeinfer.config.analytics import ClipConfig, RecordConfig
    from edgeinfer.frames import Frame
    from edgeinfer.runtime.memory import rss_mb

    scene = Scene((1920, 1080))
    raw = 1920 * 1080 * 3
    rows = []
    for max_width in (1280, None):
        for pre_s in pre_values:
            gc.collect()
            rss0 = rss_mb()
            config = RecordConfig(clips=ClipConfig(pre_s=pre_s, fps=10.0, max_width=max_width))
            rec = Recorder("bench", config, tmp / f"pre-{pre_s}-{max_width}")
            rec.start()
            for i in range(int((pre_s + 1) * FPS)):
                clock = i / FPS
                rec.offer(Frame(i, clock, time.time(), scene.frame(i), start=clock), clock, ())
                while rec.stats()["queued"]:  # the encoder keeps up, as at a camera's pace
                    time.sleep(0.002)
            s = rec.stats()
            rss1 = rss_mb()
            rec.close()
            rows.append({"pre_s": pre_s, "max_width": max_width, "ring_frames": s["ring_frames"],
                         "ring_bytes": s["ring_bytes"], "buffer_bytes": s["buffer_bytes"],
                         "raw_bytes": s["ring_frames"] * raw,
                         "raw_over_ring": round(s["ring_frames"] * raw / s["ring_bytes"], 1),
                         "kib_per_frame": round(s["ring_bytes"] / s["ring_frames"] / 1024, 1),
                         "rss_growth_mb": round(rss1 - rss0, 1),
                         "dropped": s["dropped_queue"] + s["dropped_buffer"]})
            del rec
    return rows


# -- 3. soak ----------------------------------------------------------------------------------

def detections(frames: int, seed: int, size: tuple[int, int]) -> Any:
    """Per frame, the detections of objects that cross the frame: one starts every 4 s from
    alternate sides, takes 3 s to cross, drifts down a little; boxes jitter (seeded)."""
    from edgeinfer.frames import Detection

    rng = np.random.default_rng(seed)
    w, h = size
    spawn, cross = int(4 * FPS), int(3 * FPS)
    for i in range(frames):
        dets = []
        for k in range(max(0, (i - cross) // spawn), i // spawn + 1):
            age = i - k * spawn
            if not 0 <= age < cross:
                continue
            u = age / cross if k % 2 == 0 else 1 - age / cross
            x, y = u * w, h * (0.2 + 0.02 * (k % 5)) + age * 0.6  # some cross "row"
            box = np.array([x - 30, y, x + 30, y + 60]) + rng.normal(0, 1.5, 4)
            label, cid = ("person", 0) if k % 3 else ("car", 2)
            x1, y1, x2, y2 = (float(v) for v in box)
            dets.append(Detection(label, cid, float(rng.uniform(0.6, 0.95)), (x1, y1, x2, y2)))
        yield tuple(dets)


def soak(tmp: Path, frames: int, seed: int, clip_format: str) -> dict[str, Any]:
    from edgeinfer.analytics.stage import SceneAnalytics, media_dir
    from edgeinfer.config import parse_config
    from edgeinfer.frames import Frame, TaskResult
    from edgeinfer.runtime.memory import rss_mb

    pc = parse_config(json.dumps({"pipelines": [{
        "name": "soak", "model": {"path": "m.onnx"}, "source": {"type": "synthetic"},
        "task": {"type": "detect", "decoder": "yolov8"}, "track": {}, "zones": ZONES,
        "lines": LINES, "record": {"events": ["cross"], "clips": {
            "pre_s": 3, "post_s": 3, "fps": 10, "format": clip_format},
                                   "retention": {"max_mb": 8, "max_age_h": None,
                                                 "min_free_mb": 10}}}]})).pipelines[0]
    scene = Scene(SIZE)
    images = [scene.frame(i * 7) for i in range(16)]  # real frames, cycled
    analytics = SceneAnalytics(pc, class_names=["person", "bicycle", "car"], state_dir=tmp)
    recorder = analytics.recorder
    assert recorder is not None
    analytics.start()
    every = max(frames // 10, 1)
    samples: list[tuple[int, float, float]] = []
    process_ms: list[float] = []
    events = snaps = 0
    clips: set[str] = set()
    gc.collect()
    tracemalloc.start()
    t_start = time.perf_counter()
    for i, dets in enumerate(detections(frames, seed, SIZE)):
        clock = i / FPS
        frame = Frame(i, clock, 1.7e9 + clock, images[i % len(images)], start=clock)
        t0 = time.perf_counter()
        found = analytics.process(frame, TaskResult(detections=dets))[1]
        process_ms.append((time.perf_counter() - t0) * 1000)
        events += len(found)
        clips.update(e["clip"] for e in found if e["clip"])
        snaps += sum(1 for e in found if e["snapshot"])
        while _behind(recorder.stats(), len(clips), snaps):
            time.sleep(0.002)
        if (i + 1) % every == 0:
            samples.append((i + 1, rss_mb(), tracemalloc.get_traced_memory()[0] / MIB))
    elapsed = time.perf_counter() - t_start
    media = recorder.stats()
    tracemalloc.stop()
    analytics.close()
    files = [p for p in media_dir(tmp, "soak").rglob("*") if p.is_file()]
    xs = np.array([s[0] for s in samples], dtype=float)
    tail = xs > xs.max() * 0.2

    def slope(col: int) -> float:
        ys = np.array([s[col] for s in samples], dtype=float)
        return round(float(np.polyfit(xs[tail], ys[tail], 1)[0]) * 1000, 4)

    ms = np.array(process_ms)
    return {
        "frames": frames, "seconds": round(elapsed, 1), "events": events,
        "samples": [{"frame": f, "rss_mb": round(r, 1), "traced_mb": round(t, 2)}
                    for f, r, t in samples],
        "rss_slope_mb_per_1000": slope(1), "traced_slope_mb_per_1000": slope(2),
        "process_ms": {"p50": round(float(np.percentile(ms, 50)), 3),
                       "p99": round(float(np.percentile(ms, 99)), 3),
                       "max": round(float(ms.max()), 2)},
        "buffer_bytes_end": media["buffer_bytes"], "ring_bytes_end": media["ring_bytes"],
        "encoded": media["encoded"], "dropped": media["dropped_queue"] + media["dropped_buffer"],
        "clip_format": media["clip_format"],
        "clips_written": media["clips_written"], "snapshots_written": media["snapshots_written"],
        "deleted_by_retention": media["deleted"],
        "files_on_disk": {"snapshots": sum(p.suffix == ".jpg" for p in files),
                          "clips": sum(p.suffix != ".jpg" for p in files)},
        "mb_on_disk": round(sum(p.stat().st_size for p in files) / MIB, 2), "retention_max_mb": 8,
    }


def _behind(media: dict[str, Any], clips: int, snapshots: int) -> bool:
    """Whether the encoder or the writer lags (frames queued, or finished clips and snapshots
    not written yet): the soak runs faster than real time at the pace they keep, as a 30 fps
    camera would leave them time to."""
    unwritten_clips = clips - media["clips_written"] - media["pending_clips"]
    unwritten_snaps = snapshots - media["snapshots_written"] - media["snapshots_missed"]
    return bool(media["queued"] > 1 or unwritten_clips > 1 or unwritten_snaps > 4)


def counter_save_ms(tmp: Path, n: int = 20) -> float:
    """One counters save (atomic write, two fsyncs): done in the emit thread, at most 1/s."""
    from edgeinfer.analytics.counters import CounterStore

    store = CounterStore(tmp / "analytics" / "probe.json")
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        store.save({"zones": {"a": {"entered": i}}, "lines": {"b": {"in": i, "out": 0}}})
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 3)


# -- report -----------------------------------------------------------------------------------

def render(r: dict[str, Any]) -> str:
    t = r["throughput"]
    off, on = t["off"], t["on"]
    lines = [
        f"Throughput: {t['frames']}-frame {SIZE[0]}x{SIZE[1]} {FPS:g} fps video, YOLOv8n-320 "
        f"CPU 1 thread; {t['rounds']} alternating rounds, medians. {r['machine']}", "",
        "| measure | analytics off | analytics on | on / off |", "|---|---|---|---|",
        f"| frames/s | {off['fps']:.1f} | {on['fps']:.1f} | {t['ratio']:.3f} "
        f"({t['ratio_range'][0]:.3f}-{t['ratio_range'][1]:.3f}) |",
        f"| emit `post` ms p50 / p99 / mean | {off['post_p50_ms']:.2f} / {off['post_p99_ms']:.2f}"
        f" / {off['post_mean_ms']:.2f} | {on['post_p50_ms']:.2f} / {on['post_p99_ms']:.2f} / "
        f"{on['post_mean_ms']:.2f} | |",
        f"| `infer` ms p50 | {off['infer_p50_ms']:.2f} | {on['infer_p50_ms']:.2f} | |",
        f"| process CPU ms per frame (all threads) | {off['cpu_ms_per_frame']:.2f} | "
        f"{on['cpu_ms_per_frame']:.2f} | {on['cpu_ms_per_frame'] / off['cpu_ms_per_frame']:.3f} |",
        "", f"Events per run (on): {t['events_per_run']}; media of the last run: "
        f"{t['media_last_run']}; one counters save (2 fsyncs, emit thread, <= 1/s): "
        f"{r['counter_save_ms']} ms.", "",
        "| pre_s | max_width | ring frames | ring KiB | buffer KiB | raw 1080p KiB | raw / ring "
        "| KiB per frame | RSS growth MiB |", "|---|---|---|---|---|---|---|---|---|"]
    for p in r["preroll"]:
        lines.append(f"| {p['pre_s']:g} | {p['max_width'] or 'full'} | {p['ring_frames']} | "
                     f"{p['ring_bytes'] // 1024} | {p['buffer_bytes'] // 1024} | "
                     f"{p['raw_bytes'] // 1024} | {p['raw_over_ring']} | {p['kib_per_frame']} | "
                     f"{p['rss_growth_mb']} |")
    s = r.get("soak")
    if s:
        lines += ["", f"Soak: {s['frames']} frames in {s['seconds']} s, {s['events']} events; "
                  f"RSS slope {s['rss_slope_mb_per_1000']} MiB / 1000 frames, tracemalloc slope "
                  f"{s['traced_slope_mb_per_1000']} MiB / 1000 frames (last 80 %); "
                  f"RSS {s['samples'][0]['rss_mb']} -> {s['samples'][-1]['rss_mb']} MiB; "
                  f"process() ms p50 {s['process_ms']['p50']} p99 {s['process_ms']['p99']} "
                  f"max {s['process_ms']['max']}; buffer {s['buffer_bytes_end'] // 1024} KiB at "
                  f"the end; clips {s['clips_written']}, snapshots {s['snapshots_written']}, "
                  f"deleted {s['deleted_by_retention']}; on disk {s['files_on_disk']} "
                  f"{s['mb_on_disk']} MiB (max_mb {s['retention_max_mb']}); "
                  f"dropped {s['dropped']}."]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds of 120 frames, 1,000-frame "
                    "soak, pre_s 3 only (under a minute)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--soak", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clip-format", default="auto", choices=["auto", "h264", "vp8", "mp4v",
                                                              "mjpeg"])
    ap.add_argument("--soak-clip-format", default="mp4v", choices=["auto", "h264", "vp8", "mp4v",
                                                                   "mjpeg"],
                    help="VP8 (auto here) writes a 6 s 720p clip slower than real time")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.frames, args.soak = 2, 120, 1000
    result: dict[str, Any] = {"seed": args.seed, "machine": machine_facts(),
                              "args": {k: v for k, v in vars(args).items() if k != "json"}}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        video = write_video(tmp / "scene.avi", args.frames)
        result["throughput"] = throughput(video, tmp, args.rounds, args.clip_format)
        result["counter_save_ms"] = counter_save_ms(tmp)
        result["preroll"] = preroll(tmp, [3.0] if args.quick else [3.0, 5.0, 10.0])
        result["soak"] = (soak(tmp / "soak", args.soak, args.seed, args.soak_clip_format)
                          if args.soak else None)
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
