"""OTA benchmark: push, verify and commit a 12 MB model over loopback while the stream runs.

    python3 bench/ota.py [--rounds 3] [--fps 10] [--no-write]

A real mosquitto, a real daemon (``edgeinfer run``) running YOLOv8n-320 (float, 12.3 MB) on a
looping video at ``--fps``, results at QoS 1 to the broker. Each round pushes a new version
of that model (the same network saved with a different doc string: 12 MB of new bytes that
pass every check) with `edgeinfer.ota.push.Pusher`, signed, and measures:

1. end-to-end time from the offer to ``committed``, split into transfer (offer to
   ``verifying``), verification (to ``applied``: checks, a trial run in a worker, loading and
   warming the new session) and the health gate (to ``committed``);
2. the gaps between consecutive results on the broker: the longest gap from the offer to
   two seconds after the commit, against the median interval before the offer (target: at
   most 2x, the stream does not stop);
3. the cost of checking every chunk against its signed sha256 (format 2), in one run: the
   device's receive path (`StagedTransfer.write` of every chunk of the 12 MB file, then the
   flush) with the check and without it (the write as it was before the check), rounds
   alternating, medians; the manifest's size with its chunk list; and on the push side,
   `build_manifest` (which hashes every chunk) against hashing the file once.

The results replace the ota section of docs/benchmarks.md (between its markers).
"""

from __future__ import annotations

import argparse
import json
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

from _report import machine_facts, write_section


class Watcher:
    """Arrival times of results and OTA statuses of one device, from a paho subscriber."""

    def __init__(self, host: str, port: int, device: str) -> None:
        import paho.mqtt.client as mqtt

        self.results: list[tuple[float, str]] = []  # (arrival, model version)
        self.statuses: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-watch")
        self.client.on_message = self._on_message
        self.client.connect(host, port)
        self.client.subscribe([(f"edgeinfer/{device}/det/result", 1),
                               (f"edgeinfer/{device}/ota/status", 1)])
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        now = time.monotonic()
        body = json.loads(msg.payload)
        with self._lock:
            if msg.topic.endswith("/result"):
                self.results.append((now, body["model"]["version"]))
            else:
                self.statuses.append((now, body))

    def first_state(self, state: str, version: str, after: float) -> float:
        with self._lock:
            return next(t for t, s in self.statuses
                        if t >= after and s["state"] == state and s.get("version") == version)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def new_version(src: Path, dest: Path, n: int) -> Path:
    import onnx

    model = onnx.load(str(src))
    model.doc_string = f"edgeinfer OTA benchmark, version {n}"
    onnx.save(model, str(dest))
    return dest


def run(rounds: int, fps: float) -> dict[str, Any]:
    from edgeinfer import catalog, samples
    from edgeinfer.config.mqtt import MqttConfig
    from edgeinfer.mqtt.client import MqttClient
    from edgeinfer.ota.keys import generate_keypair, load_private_key
    from edgeinfer.ota.push import Pusher
    from edgeinfer.testing.mosquitto import Mosquitto

    yolo = catalog.pull("nudenet-320n")
    tmp = Path(tempfile.mkdtemp(prefix="edgeinfer-bench-ota-"))
    private, public, _ = generate_keypair(tmp / "key")
    key = load_private_key(private)
    video = samples.demo_video(tmp / "clip.avi", frames=60, fps=fps)
    rows: list[dict[str, Any]] = []
    with Mosquitto() as broker:
        config = tmp / "config.yaml"
        config.write_text(json.dumps({
            "device_id": "bench",
            "runtime": {"state_dir": str(tmp / "state")},
            "mqtt": {"host": broker.host, "port": broker.port},
            "ota": {"trusted_keys": [str(public)],
                    "health": {"min_inferences": 20, "window_s": 60}},
            "pipelines": [{
                "name": "det",
                "source": {"type": "video", "uri": str(video), "fps": fps, "loop": True},
                "model": {"path": str(yolo), "version": "1", "threads": 1},
                "task": {"type": "detect", "decoder": "yolov8",
                         "preprocess": {"size": [320, 320], "scale": 0.00392157}},
                "sinks": [{"type": "mqtt"}],
            }],
        }))
        watcher = Watcher(broker.host, broker.port, "bench")
        daemon = subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(config)],
                                  cwd=ROOT, stderr=subprocess.DEVNULL)
        client = MqttClient(MqttConfig(host=broker.host, port=broker.port), "bench-push",
                            announce=False)
        client.start()
        try:
            deadline = time.monotonic() + 60
            while len(watcher.results) < 3 * fps and time.monotonic() < deadline:
                time.sleep(0.2)
            pusher = Pusher(client, "edgeinfer")
            for n in range(2, rounds + 2):
                model = new_version(yolo, tmp / f"yolo-v{n}.onnx", n)
                time.sleep(3)  # a steady stream before the push
                t0 = time.monotonic()
                final = pusher.push(model, devices=["bench"], group=None, pipeline="det",
                                    version=str(n), key=key, timeout_s=300)
                done = time.monotonic()
                state = final["bench"].state
                if state != "committed":
                    raise SystemExit(f"round {n}: {state}: {final['bench'].message}")
                time.sleep(2)
                rows.append(measure(watcher, t0, done, str(n), model.stat().st_size))
        finally:
            client.stop()
            daemon.terminate()
            daemon.wait(20)
            watcher.close()
        checks = chunk_checks(tmp / "yolo-v2.onnx", 40, tmp)
    return {"rounds": rows, "fps": fps, "model_bytes": rows[0]["bytes"] if rows else 0,
            "chunk_checks": checks}


def measure(w: Watcher, t0: float, done: float, version: str, size: int) -> dict[str, Any]:
    with w._lock:
        times = [t for t, _ in w.results]
    before = [b - a for a, b in zip(times, times[1:]) if b < t0]
    during = [t for t in times if t0 - 1 <= t <= done + 2]
    gaps = [b - a for a, b in zip(during, during[1:])]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    verifying = w.first_state("verifying", version, t0)
    applied = w.first_state("applied", version, t0)
    committed = w.first_state("committed", version, t0)
    normal = statistics.median(before[-100:])
    return {
        "version": version, "bytes": size,
        "total_s": committed - t0, "transfer_s": verifying - t0,
        "verify_s": applied - verifying, "gate_s": committed - applied,
        "normal_ms": normal * 1000, "max_gap_ms": max(gaps) * 1000,
        "gap_ratio": max(gaps) / normal,
        "max_gap_ends_at_s": during[worst + 1] - t0,  # when it happened, after the offer
    }


class _Unchecked:
    """``StagedTransfer.write`` as it was before chunks were checked against the manifest (the
    baseline of the per-chunk check's cost)."""

    @staticmethod
    def write(st: Any, index: int, data: bytes) -> bool:
        import os

        if not 0 <= index < st.chunks or len(data) != st.expected_length(index):
            raise ValueError(index)
        st.last_chunk = time.monotonic()
        if st._have[index]:
            return False
        os.pwrite(st._fd, data, index * st.chunk_size)
        st._have[index] = 1
        st._received += 1
        st._dirty = True
        return True


def chunk_checks(model: Path, rounds: int, tmp: Path) -> dict[str, Any]:
    """The per-chunk check on the device's receive path, with and without, alternating."""
    from edgeinfer.ota import manifest as mf
    from edgeinfer.ota.keys import PrivateKey
    from edgeinfer.ota.receiver import StagedTransfer
    from edgeinfer.runtime.modelfile import file_sha256

    key = PrivateKey.generate()
    target = mf.Target(device="bench")
    m = mf.build_manifest(model, pipeline="det", version="b", target=target,
                          key_id=key.key_id)
    payload = mf.make_offer(m, key)
    offer = mf.parse_offer(payload)
    blob = model.read_bytes()
    pieces = [blob[i:i + m.chunk_size] for i in range(0, len(blob), m.chunk_size)]
    times: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for r in range(rounds):
        order = ["checked", "unchecked"] if r % 2 == 0 else ["unchecked", "checked"]
        for variant in order:
            folder = tmp / f"staging-{variant}-{r}"
            st = StagedTransfer.create(folder, payload, offer, m, None)
            write = st.write if variant == "checked" else (
                lambda i, d, st=st: _Unchecked.write(st, i, d))
            t0 = time.perf_counter()
            for i, piece in enumerate(pieces):
                write(i, piece)
            st.flush()
            times[variant].append(time.perf_counter() - t0)
            assert st.complete
            st.remove()
    build, digest = [], []
    for _ in range(max(3, rounds // 4)):
        t0 = time.perf_counter()
        mf.build_manifest(model, pipeline="det", version="b", target=target)
        build.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        file_sha256(model)
        digest.append(time.perf_counter() - t0)
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp)], capture_output=True,
                        text=True).stdout.strip() or "?"
    checked = statistics.median(times["checked"])
    unchecked = statistics.median(times["unchecked"])
    chunk_list = len(mf.encode(m.chunks))
    return {
        "rounds": rounds, "filesystem": fs, "chunks": len(pieces), "chunk_size": m.chunk_size,
        "bytes": len(blob), "checked_ms": checked * 1000, "unchecked_ms": unchecked * 1000,
        "ratio": checked / unchecked,
        "per_chunk_us": (checked - unchecked) / len(pieces) * 1e6,
        "offer_bytes": len(payload), "chunk_list_bytes": chunk_list,
        "build_manifest_ms": statistics.median(build) * 1000,
        "file_sha256_ms": statistics.median(digest) * 1000,
    }


def chunk_report(c: dict[str, Any]) -> str:
    return "\n".join([
        f"Per-chunk checks (format 2): the device's receive path, `StagedTransfer.write` of the "
        f"{c['chunks']} chunks ({c['chunk_size'] // 1024} KiB) of the {c['bytes'] / 1e6:.1f} MB "
        f"file into a staged file on {c['filesystem']} and one flush (fsync), with the check "
        "against the signed sha256 of each chunk and without it (the write as it was before), alternating, "
        f"{c['rounds']} rounds each, medians; in the same run.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| receive path without the check, ms | {c['unchecked_ms']:.1f} |",
        f"| receive path with the check, ms | {c['checked_ms']:.1f} |",
        f"| with / without | {c['ratio']:.2f} |",
        f"| cost per chunk, µs | {c['per_chunk_us']:.0f} |",
        f"| signed chunk list in the offer, bytes | {c['chunk_list_bytes']} "
        f"(offer {c['offer_bytes']}) |",
        f"| push side: `build_manifest` (file hashed whole and per chunk), ms | "
        f"{c['build_manifest_ms']:.0f} |",
        f"| push side: hashing the file once, ms | {c['file_sha256_ms']:.0f} |",
    ])


def report(data: dict[str, Any]) -> str:
    rows = data["rounds"]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    lines = [
        f"A daemon runs YOLOv8n-320 (float) on a looping video at {data['fps']:g} fps with "
        f"results at QoS 1 to a local mosquitto; each round pushes a new {data['model_bytes'] / 1e6:.1f} MB "
        "version of the model (signed, 256 KiB chunks) with `edgeinfer.ota.push.Pusher` and "
        f"waits for `committed`; {len(rows)} rounds, medians. {machine_facts()}",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| push to `committed`, end to end, s | {med('total_s'):.2f} | report |",
        f"| ... transfer (offer to `verifying`), s | {med('transfer_s'):.2f} | |",
        f"| ... verification (checks, trial run in a worker, new session loaded and warmed), s "
        f"| {med('verify_s'):.2f} | |",
        f"| ... health gate (20 inferences on the new model), s | {med('gate_s'):.2f} | |",
        f"| transfer rate, MB/s | {data['model_bytes'] / 1e6 / med('transfer_s'):.1f} | |",
        f"| normal interval between results, ms | {med('normal_ms'):.0f} | |",
        f"| longest gap between results, offer to commit + 2 s, ms | {med('max_gap_ms'):.0f} | |",
        f"| longest gap / normal interval | {med('gap_ratio'):.2f} (worst round "
        f"{max(r['gap_ratio'] for r in rows):.2f}) | <= 2 |",
    ]
    if "chunk_checks" in data:
        lines += ["", chunk_report(data["chunk_checks"])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fps", type=float, default=10.0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    data = run(args.rounds, args.fps)
    body = report(data)
    print(body)
    print(json.dumps({"rounds": data["rounds"], "chunk_checks": data.get("chunk_checks")},
                     indent=1))
    if not args.no_write:
        write_section(ROOT / "docs" / "benchmarks.md", "ota", "Model updates over the air", body,
                      f"python3 bench/ota.py --rounds {args.rounds} --fps {args.fps:g}")


if __name__ == "__main__":
    main()
