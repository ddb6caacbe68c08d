"""Cost of the web view (issue 16): pipeline frames/s with ``http:`` and with live viewers,
``POST /v1/infer`` against ``Model.run``, and memory with a viewer connected.

    python3 bench/web.py [--quick] [--rounds 3] [--frames 1500] [--soak 10000] [--seed 0]
                         [--json]

Everything runs as the daemon runs it, in one process: ``Pipeline.from_config`` and, when the
config has ``http:``, ``WebServer`` on a free loopback port (the daemon's ``Host`` is a small
class here), with the daemon's ``return_frames_to_the_os()``. Viewers are a separate process
(``--viewers N URL``: one thread per viewer reading ``live.mjpg`` continuously over HTTP), as a
browser would be.

1. Throughput: the scene video made from real photographs (``edgeinfer.testing.scene_video``,
   640x480, the astronaut's face crossing a line and dwelling in a zone), looping and unpaced
   (so CPU contention shows) -> letterbox -> YOLOv8n-320 (onnxruntime CPU, 1 thread, no probe)
   -> decode + NMS, with its zone and line, no sinks. Three configs: no ``http:``; ``http:``
   with no viewer; ``http:`` with two viewers (default ``live_fps`` 5). Each run warms up, waits
   for the viewers' first frame, then times ``--frames`` results (result callback clock).
   Rounds rotate the order; ratios are medians of per-round ratios, with their range.
2. ``POST /v1/infer?pipeline=NAME`` with one real photograph (the astronaut, JPEG) over one
   keep-alive connection, against the same work in the same process: decode (the server's
   ``decode_image``) + ``task.preprocess`` + ``Model.run`` + ``task.postprocess`` + JSON.
   Requests alternate with direct runs; the pipeline is paused meanwhile (nothing else runs).
3. Memory: BlazeFace on the scene video, looping and unpaced, with one viewer at ``live_fps``
   30 (the encoder's busiest) for ``--soak`` frames; resident memory every tenth of the run;
   slope over the last 80 % in MiB per 1,000 frames.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _report import machine_facts

NAME = "scene"
BOUNDARY = b"--edgeinferframe"


# -- the viewers' process ---------------------------------------------------------------------

def viewers_main(count: int, url: str) -> int:
    """``count`` threads read ``url`` (an MJPEG stream) until stdin closes; prints the parts
    each received as JSON. Prints ``ready`` once every viewer has its first part."""
    host, port, path = _split(url)
    parts = [0] * count
    first = [threading.Event() for _ in range(count)]
    stop = threading.Event()

    def read(i: int) -> None:
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("GET", path)
        response = conn.getresponse()
        if response.status != 200:
            print(f"viewer {i}: HTTP {response.status}", file=sys.stderr)
            first[i].set()
            return
        while not stop.is_set():
            chunk = response.read1(65536)
            if not chunk:
                break
            parts[i] += chunk.count(BOUNDARY)
            if parts[i]:
                first[i].set()
        conn.close()

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for e in first:
        e.wait(60)
    print("ready", flush=True)
    sys.stdin.readline()
    stop.set()
    print(json.dumps({"parts": parts}), flush=True)
    return 0


def _split(url: str) -> tuple[str, int, str]:
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    return host, int(port), "/" + path


class Viewers:
    """The viewers' process: started, waited for, stopped; ``parts`` received."""

    def __init__(self, count: int, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--viewers", str(count), url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"the viewers did not start: {line!r}")

    def stop(self) -> list[int]:
        out, _ = self.proc.communicate("\n", timeout=30)
        parts: list[int] = json.loads(out.strip().splitlines()[-1])["parts"]
        return parts


# -- the daemon's side ------------------------------------------------------------------------

class Host:
    """What the daemon gives `WebServer` (the part of ``edgeinfer.host.Host`` it uses)."""

    def __init__(self, pipelines: list[Any]) -> None:
        from edgeinfer.control.handlers import CommandHandlers

        self.pipelines = pipelines
        self.device_id = "bench-web"
        self.handlers = CommandHandlers(self, status=self.status).table()

    def status(self) -> dict[str, Any]:
        return {"device_id": self.device_id,
                "pipelines": {p.name: p.snapshot() for p in self.pipelines}}

    def reload(self) -> dict[str, Any]:
        from edgeinfer.control.commands import CommandError

        raise CommandError("no reload in the bench")

    def command(self, verb: str, request: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.handlers[verb](dict(request))
        return result


def config(video: Path, state: Path, model: str, web: dict[str, Any] | None,
           scene: dict[str, Any]) -> Any:
    from edgeinfer.config import parse_config

    decoder = "blazeface" if model == "blazeface" else "yolov8"
    task: dict[str, Any] = {"type": "detect", "decoder": decoder, "score_threshold": 0.5}
    if decoder == "yolov8":
        task["preprocess"] = {"size": [320, 320]}
    pc = {"name": NAME, "source": {"type": "video", "uri": str(video), "loop": True},
          "model": {"path": model, "threads": 1, "providers": "cpu", "probe": False},
          "task": task, "sinks": [], **scene}
    doc: dict[str, Any] = {"runtime": {"state_dir": str(state)}, "pipelines": [pc]}
    if web is not None:
        doc["http"] = web
    return parse_config(json.dumps(doc))


class Running:
    """A pipeline (and its web server when the config has ``http:``), started."""

    def __init__(self, cfg: Any) -> None:
        from edgeinfer._net import free_port
        from edgeinfer.pipeline import Pipeline

        self.times: list[float] = []
        self.pipeline = Pipeline.from_config(cfg, on_result=self._on_result)
        self.server: Any = None
        self.pipeline.start()
        if cfg.http is not None:
            import msgspec

            from edgeinfer.web import WebServer

            web = msgspec.structs.replace(cfg.http, port=free_port())
            self.server = WebServer(web, Host([self.pipeline]))
            self.server.start()

    def _on_result(self, _result: Any) -> None:
        self.times.append(time.perf_counter())

    @property
    def url(self) -> str:
        return str(self.server.url).rstrip("/")

    def wait_frames(self, n: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while len(self.times) < n:
            if time.monotonic() > deadline or self.pipeline.error is not None:
                raise SystemExit(f"pipeline stalled: {self.pipeline.error}")
            time.sleep(0.01)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        self.pipeline.close()


# -- 1. throughput ----------------------------------------------------------------------------

def one_run(cfg: Any, viewers: int, frames: int, warm: int) -> dict[str, Any]:
    run = Running(cfg)
    try:
        run.wait_frames(warm)
        watch = Viewers(viewers, f"{run.url}/v1/pipelines/{NAME}/live.mjpg") if viewers else None
        start = len(run.times)
        run.wait_frames(start + frames)
        fps = frames / (run.times[start + frames - 1] - run.times[start - 1])
        parts = watch.stop() if watch is not None else []
        encoded = run.server.stats()["frames_encoded"] if run.server is not None else 0
        return {"fps": fps, "parts": parts, "encoded": encoded}
    finally:
        run.close()


def throughput(video: Path, tmp: Path, scene: dict[str, Any], rounds: int, frames: int,
               seed: int) -> dict[str, Any]:
    modes = {"no_http": (None, 0), "http": ({}, 0), "http_2_viewers": ({}, 2)}
    cfgs = {m: config(video, tmp / m, "nudenet-320n", web, scene)
            for m, (web, _) in modes.items()}
    one_run(cfgs["http"], 0, 30, 10)  # warm-up: model file, OpenCV, aiohttp
    order = list(modes)
    random.Random(seed).shuffle(order)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(rounds):
        for m in order[r % 3:] + order[:r % 3]:
            runs[m].append(one_run(cfgs[m], modes[m][1], frames, 20))

    def ratios(mode: str) -> list[float]:
        return [a["fps"] / b["fps"] for a, b in zip(runs[mode], runs["no_http"], strict=True)]

    out: dict[str, Any] = {"rounds": rounds, "frames": frames, "order": order}
    for m in modes:
        out[m] = {"fps": round(statistics.median(r["fps"] for r in runs[m]), 2),
                  "fps_runs": [round(r["fps"], 2) for r in runs[m]]}
    for m in ("http", "http_2_viewers"):
        rs = ratios(m)
        out[m].update(ratio=round(statistics.median(rs), 3),
                      ratio_range=[round(min(rs), 3), round(max(rs), 3)])
    last = runs["http_2_viewers"][-1]
    out["http_2_viewers"]["viewer_parts_last_run"] = last["parts"]
    out["http_2_viewers"]["encoded_last_run"] = last["encoded"]
    return out


# -- 2. POST /v1/infer against Model.run ------------------------------------------------------

def infer_latency(video: Path, tmp: Path, scene: dict[str, Any], n: int) -> dict[str, Any]:
    import cv2

    from edgeinfer import samples
    from edgeinfer.frames import Frame
    from edgeinfer.web.infer import decode_image

    ok, buf = cv2.imencode(".jpg", samples.load_image("astronaut"))
    assert ok
    photo = buf.tobytes()
    run = Running(config(video, tmp / "infer", "nudenet-320n", {}, scene))
    try:
        run.wait_frames(5)
        run.pipeline.pause()
        p = run.pipeline
        host, port, _ = _split(run.url)
        conn = http.client.HTTPConnection(host, port, timeout=30)

        def over_http() -> dict[str, Any]:
            conn.request("POST", f"/v1/infer?pipeline={NAME}", body=photo,
                         headers={"Content-Type": "image/jpeg"})
            response = conn.getresponse()
            body = response.read()
            if response.status != 200:
                raise SystemExit(f"/v1/infer: HTTP {response.status}: {body[:200]!r}")
            return dict(json.loads(body))

        def direct() -> dict[str, Any]:
            frame = Frame(index=0, ts=time.monotonic(), wall=time.time(),
                          data=decode_image(photo, 20_000_000))
            feeds, context = p.task.preprocess(frame)
            part = p.task.postprocess(p.model.run(feeds), frame, context)
            return dict(json.loads(json.dumps(part.to_dict(), default=str)))

        same = over_http()["detections"] == direct()["detections"]
        for _ in range(3):
            over_http(), direct()
        times: dict[str, list[float]] = {"http": [], "direct": []}
        for i in range(n):
            for kind, fn in (("http", over_http), ("direct", direct))[:: 1 if i % 2 else -1]:
                t0 = time.perf_counter()
                fn()
                times[kind].append((time.perf_counter() - t0) * 1000)
        conn.close()
    finally:
        run.close()
    p50 = {k: statistics.median(v) for k, v in times.items()}
    return {"requests": n, "same_detections": same, "image": "astronaut 512x512 JPEG",
            "http_p50_ms": round(p50["http"], 2), "direct_p50_ms": round(p50["direct"], 2),
            "http_p90_ms": round(_pct(times["http"], 0.9), 2),
            "direct_p90_ms": round(_pct(times["direct"], 0.9), 2),
            "ratio": round(p50["http"] / p50["direct"], 3),
            "overhead_ms": round(p50["http"] - p50["direct"], 2)}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- 3. memory with a viewer ------------------------------------------------------------------

def soak(video: Path, tmp: Path, scene: dict[str, Any], frames: int) -> dict[str, Any]:
    from edgeinfer.runtime.memory import rss_mb

    run = Running(config(video, tmp / "soak", "blazeface", {"live_fps": 30}, scene))
    try:
        run.wait_frames(50)
        watch = Viewers(1, f"{run.url}/v1/pipelines/{NAME}/live.mjpg")
        step = max(frames // 10, 1)
        start = len(run.times)
        t0 = time.perf_counter()
        samples: list[tuple[int, float]] = [(0, rss_mb())]
        for k in range(1, 11):
            run.wait_frames(start + k * step, timeout=600)
            samples.append((k * step, rss_mb()))
        elapsed = time.perf_counter() - t0
        parts = watch.stop()
        encoded = run.server.stats()["frames_encoded"]
    finally:
        run.close()
    tail = samples[2:]  # the last 80 %
    slope = _slope([f / 1000 for f, _ in tail], [m for _, m in tail])
    return {"frames": 10 * step, "fps": round(10 * step / elapsed, 1), "live_fps": 30,
            "viewer_parts": parts[0], "encoded": encoded,
            "rss_mb": [round(m, 1) for _, m in samples],
            "slope_mib_per_1000_frames": round(slope, 3)}


def _slope(x: list[float], y: list[float]) -> float:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / \
        sum((a - mx) ** 2 for a in x)


# -- report -----------------------------------------------------------------------------------

def table(r: dict[str, Any]) -> str:
    t, i, s = r["throughput"], r["infer"], r["soak"]
    v = t["http_2_viewers"]
    rows = [
        "| measure | value | ratio | target |", "|---|---|---|---|",
        f"| frames/s, no `http:` (YOLOv8n-320, 1 thread, 640x480 unpaced) | {t['no_http']['fps']}"
        " | 1.000 | |",
        f"| frames/s, `http:` and no viewer | {t['http']['fps']} | {t['http']['ratio']} "
        f"({t['http']['ratio_range'][0]}-{t['http']['ratio_range'][1]}) | >= 0.99 |",
        f"| frames/s, two viewers on `live.mjpg` (live_fps 5) | {v['fps']} | {v['ratio']} "
        f"({v['ratio_range'][0]}-{v['ratio_range'][1]}) | >= 0.95 |",
        f"| `POST /v1/infer` p50 ms vs decode + `Model.run` + task, same process | "
        f"{i['http_p50_ms']} vs {i['direct_p50_ms']} | {i['ratio']} | report |",
        f"| RSS slope with a viewer (BlazeFace, live_fps 30), MiB / 1,000 frames over "
        f"{s['frames'] * 4 // 5} frames | {s['slope_mib_per_1000_frames']} "
        f"({s['rss_mb'][0]} -> {s['rss_mb'][-1]} MiB) | | ~0 |",
    ]
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round, 300 frames, 2,000 soaked")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--frames", type=int, default=1500)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--soak", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--viewers", nargs=2, metavar=("N", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.viewers:
        return viewers_main(int(args.viewers[0]), args.viewers[1])
    if args.quick:
        args.rounds, args.frames, args.requests, args.soak = 1, 300, 20, 2000

    from edgeinfer import catalog
    from edgeinfer.runtime.memory import return_frames_to_the_os
    from edgeinfer.testing.scene_video import astronaut_face_box, make_scene_video

    return_frames_to_the_os()  # as the daemon does at start
    random.seed(args.seed)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-web-") as d:
        tmp = Path(d)
        truth = make_scene_video(tmp / "scene.avi", astronaut_face_box(catalog.pull("blazeface")))
        scene = truth.scene_config()
        result = {
            "machine": machine_facts(),
            "throughput": throughput(truth.path, tmp, scene, args.rounds, args.frames,
                                     args.seed),
            "infer": infer_latency(truth.path, tmp, scene, args.requests),
            "soak": soak(truth.path, tmp, scene, args.soak),
        }
    result["seconds"] = round(time.monotonic() - t0, 1)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(result["machine"])
        print(table(result))
        print(f"({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
