"""Scene analytics end to end (issue 15): ``edgeinfer run`` as a real subprocess runs real
BlazeFace on a video made from real photographs (``edgeinfer.testing.scene_video``: the
astronaut's face crossing a line both ways and pausing in a zone), with the zone and line
events going to a real mosquitto that is killed (``kill -9``) mid-video and restarted on the
same port. Checked against the video's geometric ground truth: every event once, on the right
frame (within one frame), over MQTT to a persistent session; the retained counts, their reset
and its persistence across a restart; the event snapshots and clips on disk.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as paho
import pytest
from paho.mqtt.properties import Properties

from edgeinfer.analytics.draw import HIGHLIGHT_COLOR
from edgeinfer.testing.mosquitto import Mosquitto
from edgeinfer.testing.peer import Peer
from edgeinfer.testing.scene_video import (
    SceneTruth, astronaut_face_box, make_background_video, make_scene_video)

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "scene"
PRE_S, POST_S, CLIP_FPS = 1.0, 1.0, 7.5
OUTAGE_S = 2.5  # the broker is down from just after the first event until past the second


@pytest.fixture(scope="module")
def truth(blazeface_path: Path, tmp_path_factory: pytest.TempPathFactory) -> SceneTruth:
    folder = tmp_path_factory.mktemp("scene")
    return make_scene_video(folder / "scene.avi", astronaut_face_box(blazeface_path))


def _iou(a: Any, b: Any) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_the_detector_sees_the_face_in_every_frame_where_the_truth_says(
        truth: SceneTruth, blazeface_path: Path) -> None:
    from edgeinfer.config.pipeline import DetectTask as DetectConfig
    from edgeinfer.frames import Frame
    from edgeinfer.model import load_model
    from edgeinfer.tasks.detect import DetectTask

    cap = cv2.VideoCapture(str(truth.path))
    assert cap.get(cv2.CAP_PROP_FPS) == truth.fps
    ious: list[float] = []
    with load_model(blazeface_path, threads=1, probe=False) as model:
        task = DetectTask(DetectConfig(decoder="blazeface", score_threshold=0.6), model)
        while True:
            ok, image = cap.read()
            if not ok:
                break
            frame = Frame(index=len(ious), ts=0.0, wall=0.0, data=image)
            feeds, context = task.preprocess(frame)
            found = task.postprocess(model.run(feeds), frame, context).detections or ()
            assert len(found) == 1, f"frame {len(ious)}: {found}"
            ious.append(_iou(found[0].box, truth.boxes[len(ious)]))
    cap.release()
    assert len(ious) == truth.frames
    assert min(ious) > 0.6, f"worst IoU {min(ious):.2f} at frame {int(np.argmin(ious))}"
    # The path makes both crossings and a visit with a dwell, in this order.
    kinds = [(e.type, e.direction) for e in truth.events]
    assert kinds == [("cross", "out"), ("enter", None), ("exit", None), ("cross", "in")]


class Subscriber:
    """MQTT 5, a fixed client id and clean_start False: a session that outlives the broker's
    kill (the broker saves it to disk) and the subscriber's reconnects."""

    def __init__(self, port: int, topics: list[str]) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self.connects = 0
        self._topics = topics
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._c = paho.Client(paho.CallbackAPIVersion.VERSION2,
                              client_id=f"e2e-sub-{uuid.uuid4().hex[:6]}", protocol=paho.MQTTv5)
        self._c.reconnect_delay_set(0.05, 0.2)
        self._c.on_connect = self._on_connect
        self._c.on_subscribe = lambda *_: self._subscribed.set()
        self._c.on_message = self._on_message
        props = Properties(paho.PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self._c.connect("127.0.0.1", port, clean_start=False, properties=props)
        self._c.loop_start()
        assert self._subscribed.wait(10), "the subscriber never subscribed"

    def _on_connect(self, client: paho.Client, *_: object) -> None:
        self.connects += 1
        client.subscribe([(t, 1) for t in self._topics])

    def _on_message(self, _c: paho.Client, _u: object, msg: paho.MQTTMessage) -> None:
        with self._lock:
            self.received.append((msg.topic, json.loads(msg.payload)))

    def events(self) -> dict[str, dict[str, Any]]:
        """Events by ``event_id`` (a redelivery counts once)."""
        with self._lock:
            return {p["event_id"]: p for t, p in self.received if t.endswith("/event")}

    def close(self) -> None:
        self._c.disconnect()
        self._c.loop_stop()


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _config(path: Path, device: str, port: int, video: Path, model: Path, state: Path,
            truth: SceneTruth, *, loop: bool = False) -> Path:
    config = {
        "device_id": device,
        "runtime": {"state_dir": str(state)},
        "mqtt": {"host": "127.0.0.1", "port": port, "stats_interval_s": 5,
                 "reconnect": {"initial_s": 0.1, "max_s": 0.3},
                 "outbox": {"replay_rate": 1000}},
        "pipelines": [{
            "name": PIPELINE,
            # Paced at the file's rate, so the broker's outage falls in the middle of it.
            "source": {"type": "video", "uri": str(video), "fps": truth.fps, "loop": loop},
            "model": {"path": str(model), "threads": 1, "probe": False},
            "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
            **truth.scene_config(),
            "record": {"snapshots": True, "events": ["enter", "exit", "cross"],
                       "clips": {"pre_s": PRE_S, "post_s": POST_S, "fps": CLIP_FPS,
                                 "format": "auto"}},
            "sinks": [{"type": "mqtt"}],
        }],
    }
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _run(config: Path, procs: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    procs.append(subprocess.Popen([sys.executable, "-m", "edgeinfer", "run", "-c", str(config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  cwd=ROOT))
    return procs[-1]


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    return stderr


def _expected_counts(truth: SceneTruth) -> dict[str, Any]:
    kinds = [(e.type, e.direction) for e in truth.events]
    return {"zones": {truth.zone_name: {"occupancy": kinds.count(("enter", None))
                                        - kinds.count(("exit", None)),
                                        "entered": kinds.count(("enter", None)),
                                        "exited": kinds.count(("exit", None)), "loiter": 0}},
            "lines": {truth.line_name: {"in": kinds.count(("cross", "in")),
                                        "out": kinds.count(("cross", "out"))}}}


def _counts(message: Any) -> dict[str, Any]:
    data = json.loads(message.payload)
    return {"zones": data["zones"], "lines": data["lines"]}


def test_events_counts_and_media_through_a_broker_kill_a_reset_and_a_restart(
        truth: SceneTruth, blazeface_path: Path, tmp_path: Path,
        procs: list[subprocess.Popen[str]]) -> None:
    device = f"e2e{uuid.uuid4().hex[:6]}"
    base = f"edgeinfer/{device}/{PIPELINE}"
    state = tmp_path / "state"
    broker = Mosquitto(persistence=True, autosave_interval_s=1)
    broker.start()
    sub = Subscriber(broker.port, [f"{base}/event"])
    try:
        broker.wait_saved()  # the subscriber's session is on disk before the kill
        config = _config(tmp_path / "run.yaml", device, broker.port, truth.path,
                         blazeface_path, state, truth)
        daemon = _run(config, procs)
        _wait(lambda: bool(sub.events()), "the first event", 60)
        broker.kill()  # mid-video: the next events wait in the daemon's outbox
        outage = [time.time()]
        time.sleep(OUTAGE_S)
        outage.append(time.time())
        broker.start()
        stderr = _stop_when_done(daemon)
        _wait(lambda: len(sub.events()) >= len(truth.events), "every event", 20)
        time.sleep(0.3)  # anything extra would arrive now
        events = sorted(sub.events().values(), key=lambda e: (e["frame"], e["seq"]))
        peer = Peer("127.0.0.1", broker.port)
        peer.subscribe(f"{base}/counts")
        retained = peer.next(f"{base}/counts", timeout=10)
        peer.close()
    finally:
        sub.close()
    # Wall time of the event's frame: an exit's ``start`` is when the object entered.
    during = [e["type"] for e in events
              if outage[0] <= e["end" if e["type"] == "exit" else "start"] <= outage[1]]
    assert during, "no event happened while the broker was down"
    assert sub.connects >= 2
    _check_events(events, truth)
    assert retained.retain and _counts(retained) == _expected_counts(truth), stderr
    for event in events:  # published at once: a path only for a file already written
        assert event["snapshot"] is None and event["snapshot_missing"] is None, event
        _check_snapshot(Path(event["snapshot_pending"]), truth)
    clips = _check_clips(events, truth)
    print(f"e2e: events at frames {[e['frame'] for e in events]} (truth "
          f"{[e.frame for e in truth.events]}), {during} while the broker was down, "
          f"{len(sub.received)} event messages for {len(events)} events, clips {clips}")
    try:
        _reset_and_restart(truth, blazeface_path, tmp_path, device, broker, procs)
    finally:
        broker.stop()
        broker.__exit__(None, None, None)


def _stop_when_done(daemon: subprocess.Popen[str]) -> str:
    """The video is not looped: the daemon ends by itself when it is done."""
    _, stderr = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, stderr
    return stderr


def _check_events(events: list[dict[str, Any]], truth: SceneTruth) -> None:
    period = 1.0 / truth.fps
    got = [(e["type"], e["zone"] or e["line"], e["direction"]) for e in events]
    want = [(e.type, e.name, e.direction) for e in truth.events]
    assert got == want, got
    assert len({e["track_id"] for e in events}) == 1  # one face, one track throughout
    enter_frame = None
    for event, true in zip(events, truth.events, strict=True):
        assert abs(event["frame"] - true.frame) <= 1, (event, true)
        assert abs(event["t"] - true.frame * period) <= period + 1e-3, (event, true)
        assert event["pipeline"] == PIPELINE and event["label"] == "face"
        codec, _, container = event["clip_format"].partition("/")  # "mp4v/mp4"
        assert codec and event["clip"].endswith(f".{container}"), event
        if true.type == "enter":
            enter_frame = true.frame
            assert abs(event["t_start"] - event["t"]) <= 1e-3
        if true.type == "exit":
            assert enter_frame is not None
            dwell = (true.frame - enter_frame) * period
            assert abs(event["dwell_s"] - dwell) <= period + 1e-3, (event["dwell_s"], dwell)
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"]
                                                     + len(events)))


def _locate(image: np.ndarray, truth: SceneTruth) -> tuple[int, int]:
    """Top-left corner of the pasted face crop in a decoded frame (template matching)."""
    gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    patch = cv2.cvtColor(truth.patch, cv2.COLOR_BGR2GRAY)
    scores = cv2.matchTemplate(gray, patch, cv2.TM_CCOEFF_NORMED)
    _, best, _, at = cv2.minMaxLoc(scores)
    assert best > 0.8, f"the face is not in the image (best match {best:.2f})"
    return int(at[0]), int(at[1])


def _check_snapshot(path: Path, truth: SceneTruth) -> None:
    """The snapshot decodes and the event's track is drawn (highlight colour) around the face
    where it is in that image (the event's own frame, or the last one an exit's track was seen
    in)."""
    _wait(path.is_file, f"snapshot {path}", 10)
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[:2] == (truth.size[1], truth.size[0])
    x, y = _locate(image, truth)
    ph, pw = truth.patch.shape[:2]
    crop = image[y:y + ph, x:x + pw].astype(np.int16)  # the face crop is opaque: no background
    want = np.array(HIGHLIGHT_COLOR, dtype=np.int16)
    drawn = (np.abs(crop - want) < 90).all(axis=2)
    fx1, fy1, fx2, fy2 = truth.face_in_patch
    # The box's sides: columns and rows of the crop mostly in the highlight colour.
    cols = np.flatnonzero(drawn.sum(axis=0) > 0.5 * (fy2 - fy1))
    rows = np.flatnonzero(drawn.sum(axis=1) > 0.5 * (fx2 - fx1))
    assert cols.size and rows.size, f"{path.name}: no box drawn around the face"
    box = (cols.min(), rows.min(), cols.max(), rows.max())
    assert _iou(box, truth.face_in_patch) > 0.6, (path.name, box, truth.face_in_patch)


def _check_clips(events: list[dict[str, Any]], truth: SceneTruth) -> list[tuple[int, int]]:
    """Events close together share a clip; each clip runs from ``pre_s`` before its first
    event to ``post_s`` after its last at ``CLIP_FPS``, and starts where the face was then."""
    by_clip: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_clip.setdefault(event["clip"], []).append(event)
    assert len(by_clip) >= 2
    lengths = []
    for clip, its in by_clip.items():
        _wait(Path(clip).is_file, f"clip {clip}", 10)
        cap = cv2.VideoCapture(clip)
        frames = []
        while True:
            ok, image = cap.read()
            if not ok:
                break
            frames.append(image)
        fps = cap.get(cv2.CAP_PROP_FPS)
        cap.release()
        span = its[-1]["t"] + POST_S - (its[0]["t"] - PRE_S)
        assert abs(fps - CLIP_FPS) < 0.01, fps
        assert abs(len(frames) - span * CLIP_FPS) <= 2, (clip, len(frames), span)
        assert frames[0].shape[:2] == (truth.size[1], truth.size[0])
        first = round((its[0]["t"] - PRE_S) * truth.fps)  # the video frame the clip starts at
        candidates = truth.frame_at(_locate(frames[0], truth))
        assert min(candidates) - 2 <= first <= max(candidates) + 2, (clip, first, candidates)
        lengths.append((len(frames), first))
    return lengths


def _reset_and_restart(truth: SceneTruth, model: Path, tmp_path: Path, device: str,
                       broker: Mosquitto, procs: list[subprocess.Popen[str]]) -> None:
    """The totals survive a restart; ``reset`` zeroes them, and that survives a restart too.
    These runs watch the background alone (no face, no events)."""
    base = f"edgeinfer/{device}"
    video = make_background_video(tmp_path / "empty.avi", frames=15, fps=truth.fps)
    config = _config(tmp_path / "empty.yaml", device, broker.port, video, model,
                     tmp_path / "state", truth, loop=True)
    peer = Peer("127.0.0.1", broker.port)
    peer.subscribe(f"{base}/{PIPELINE}/counts")
    try:
        zero = _zeroed(_expected_counts(truth))

        def is_zero(message: Any) -> bool:
            return _counts(message) == zero

        for expected in (_expected_counts(truth), None):
            started = _published_after(time.time())
            daemon = _run(config, procs)
            counts = peer.next(f"{base}/{PIPELINE}/counts", timeout=30, where=started)
            assert _counts(counts) == (expected or zero)
            if expected is not None:  # as an operator would: edgeinfer cmd
                done = subprocess.run(
                    [sys.executable, "-m", "edgeinfer", "cmd", device, "reset",
                     json.dumps({"pipeline": PIPELINE}), "--broker", broker.address,
                     "--timeout", "10"], capture_output=True, text=True, timeout=30, cwd=ROOT)
                assert done.returncode == 0, done.stderr
                reply = json.loads(done.stdout)
                assert reply["ok"] and reply["result"]["reset"] == {
                    PIPELINE: [truth.zone_name, truth.line_name]}, reply
                peer.next(f"{base}/{PIPELINE}/counts", timeout=10,
                          where=is_zero)
            _stop(daemon)
    finally:
        peer.close()


def _published_after(started: float) -> Callable[[Any], bool]:
    return lambda message: bool(json.loads(message.payload)["ts"] >= started)


def _zeroed(counts: dict[str, Any]) -> dict[str, Any]:
    return {"zones": {n: {**z, "entered": 0, "exited": 0, "loiter": 0}
                      for n, z in counts["zones"].items()},
            "lines": {n: {"in": 0, "out": 0} for n in counts["lines"]}}


def test_the_example_config_validates() -> None:
    path = ROOT / "configs" / "scene-analytics.yaml"
    done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(path)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    from edgeinfer.config import load_config

    pc = load_config(path).pipelines[0]
    assert pc.zones and pc.lines and pc.record is not None and pc.record.clips is not None
    tag = lambda struct: type(struct).__struct_config__.tag  # noqa: E731
    assert [tag(s) for s in pc.sinks] == ["mqtt"] and tag(pc.source) == "camera"


def test_the_docs_config_blocks_validate(tmp_path: Path) -> None:
    """docs/analytics.md's yaml blocks are configs users copy: each one validates."""
    text = (ROOT / "docs" / "analytics.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```$", text, re.M | re.S)
    assert blocks and any("snapshot: event" in b for b in blocks)
    for i, block in enumerate(blocks):
        path = tmp_path / f"block{i}.yaml"
        path.write_text(block)
        done = subprocess.run([sys.executable, "-m", "edgeinfer", "validate-config", str(path)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, (block, done.stderr)


def test_counts_made_just_before_a_stop_reach_the_retained_counts(
        truth: SceneTruth, blazeface_path: Path, tmp_path: Path, mqtt_broker: tuple[str, int],
        procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM right after the first event: the counts are published at most once a tick, so
    the stop must publish what changed since the last one (it did not: the retained counts
    said ``out: 0`` until the next start while the state file said 1)."""
    _, port = mqtt_broker
    device = f"e2e{uuid.uuid4().hex[:6]}"
    base = f"edgeinfer/{device}/{PIPELINE}"
    config = _config(tmp_path / "run.yaml", device, port, truth.path, blazeface_path,
                     tmp_path / "state", truth)
    peer = Peer("127.0.0.1", port)
    peer.subscribe(f"{base}/#")
    try:
        daemon = _run(config, procs)
        first = json.loads(peer.next(f"{base}/event", timeout=60).payload)
        _stop(daemon)
        retained = Peer("127.0.0.1", port)
        retained.subscribe(f"{base}/counts")
        counts = _counts(retained.next(f"{base}/counts", timeout=10))
        retained.close()
    finally:
        peer.close()
    assert (first["type"], first["direction"]) == (truth.events[0].type, truth.events[0].direction)
    assert counts["lines"][truth.line_name][first["direction"]] == 1, counts
