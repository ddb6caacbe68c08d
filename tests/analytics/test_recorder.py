"""Event snapshots and clips with real OpenCV and real files: pre/post-roll in every format this
build writes, best frame, bursts, the buffer bound, retention, low disk, codec probing, the
threads' lowered priority, and the cost of ``offer`` and of writing clips."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.analytics.clips import FORMATS, Entry, probe_format, write_clip
from edgeinfer.analytics.draw import TrackBox, encode_jpeg
from edgeinfer.analytics.media import MediaStore
from edgeinfer.analytics.recorder import Recorder
from edgeinfer.config.analytics import ClipConfig, RecordConfig, RetentionConfig
from edgeinfer.frames import Frame

FPS = 30.0
W, H = 320, 240
FORMAT_NAMES = {"h264/mp4", "vp8/webm", "mp4v/mp4", "mjpeg/avi"}
AUTO_ORDER = ("h264", "vp8", "mp4v", "mjpeg")
ROOMY = RetentionConfig(min_free_mb=0.01)
ZONE = ("zone1", "zone", np.array([[200, 20], [300, 20], [300, 60], [200, 60]]))
LINE = ("line1", "line", np.array([[20, 200], [120, 200]]))


def _frame(i: int) -> tuple[Frame, TrackBox]:
    """Frame ``i`` with its index as the grey level of a corner block and a moving box."""
    data = np.full((H, W, 3), 30, np.uint8)
    data[H - 48:, W - 48:] = i % 256
    x = 10 + (i % 150)
    data[80:160, x:x + 60] = (200, 200, 200)
    score = 0.95 if i == 60 else 0.5
    return (Frame(i, time.monotonic(), time.time(), data),
            TrackBox(1, "person", score, (x, 80, x + 60, 160)))


def _feed(rec: Recorder, indices: Iterable[int], events: dict[int, str] | None = None,
          ) -> dict[str, dict[str, object]]:
    """Offer frames at 30 fps of scene clock, waiting for the encoder (so nothing is dropped),
    and raise the events named at their frame index (before its offer, as the pipeline does);
    returns each event's media."""
    media = {}
    for i in indices:
        frame, box = _frame(i)
        if events and i in events:
            media[events[i]] = rec.on_event(events[i], "enter", 1, i / FPS)
        rec.offer(frame, i / FPS, [box])
        while rec.stats()["queued"]:
            time.sleep(0.0005)
    return media


def _wait(rec: Recorder, key: str, n: int, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while rec.stats()[key] < n and time.monotonic() < end:
        time.sleep(0.01)


def _read_clip(path: str) -> tuple[list[int], float]:
    """The corner grey level of every frame of a clip (the source frame's index) and its fps."""
    import cv2

    cap = cv2.VideoCapture(path)
    values = []
    while True:
        ok, image = cap.read()
        if not ok:
            break
        values.append(round(float(image[H - 40:H - 8, W - 40:W - 8].mean())))
    fps = cap.get(cv2.CAP_PROP_FPS)
    cap.release()
    return values, fps


def _config(**clip: object) -> RecordConfig:
    base = {"pre_s": 1.0, "post_s": 2.0, "fps": 10.0, "max_width": None}
    return RecordConfig(clips=ClipConfig(**{**base, **clip}), retention=ROOMY)  # type: ignore


def _works(name: str) -> bool:
    """Whether this OpenCV build writes ``name`` (an explicit format that does not falls back)."""
    fmt = probe_format(name)
    return fmt is not None and fmt.name == FORMATS[name].name


@pytest.mark.parametrize("fmt", ["auto", *AUTO_ORDER])
def test_clip_has_pre_and_post_roll(tmp_path: Path, fmt: str) -> None:
    if fmt != "auto" and not _works(fmt):
        pytest.skip(f"this OpenCV build cannot write {fmt}")
    with Recorder("cam", _config(format=fmt), tmp_path) as rec:
        media = _feed(rec, range(241), {150: "e1"})["e1"]  # event at 5 s, frames to 8 s
        _wait(rec, "clips_written", 1)
        stats = rec.stats()
    clip = media["clip"]
    assert isinstance(clip, str) and Path(clip).is_absolute()
    assert clip == str(tmp_path / "clips" / f"e1.{clip.rsplit('.', 1)[1]}")
    assert media["clip_format"] == stats["clip_format"] in FORMAT_NAMES
    if fmt != "auto":
        assert stats["clip_format"] == FORMATS[fmt].name
        assert clip.endswith(f"e1.{FORMATS[fmt].ext}")
    values, fps = _read_clip(clip)
    # Kept at 10 fps from 4 s (frame 120) to 7 s (frame 210): 31 frames at the real rate.
    assert 29 <= len(values) <= 32, values
    assert abs(values[0] - 120) <= 4 and abs(values[-1] - 210) <= 4, values
    assert abs(fps - 10.0) < 0.5
    assert stats["clips_written"] == 1 and stats["dropped_queue"] == 0
    assert not list((tmp_path / "clips").glob(".tmp-*"))


def test_close_before_post_roll_writes_a_shorter_clip(tmp_path: Path) -> None:
    rec = Recorder("cam", _config(), tmp_path)
    rec.start()
    media = _feed(rec, range(181), {150: "e1"})["e1"]  # event at 5 s, frames only to 6 s
    assert rec.stats()["clips_written"] == 0  # still waiting for frames up to 7 s
    rec.close()
    values, _ = _read_clip(str(media["clip"]))
    assert 19 <= len(values) <= 22, values
    assert abs(values[0] - 120) <= 4 and abs(values[-1] - 180) <= 4, values
    assert rec.on_event("late", "enter", 1, 9.0)["clip"] is None  # closed


def test_burst_of_events_makes_one_clip(tmp_path: Path) -> None:
    with Recorder("cam", _config(), tmp_path) as rec:
        media = _feed(rec, range(256), {150: "a", 165: "b", 180: "c"})
        _wait(rec, "clips_written", 1)
        stats = rec.stats()
    assert media["a"]["clip"] == media["b"]["clip"] == media["c"]["clip"]
    assert stats["clips_written"] == 1 and len(list((tmp_path / "clips").iterdir())) == 1
    values, _ = _read_clip(str(media["a"]["clip"]))
    # From 4 s (a's pre-roll) to 8 s (c's post-roll).
    assert abs(values[0] - 120) <= 4 and abs(values[-1] - 240) <= 4, values
    assert 38 <= len(values) <= 42
    assert media["a"]["snapshot"] != media["c"]["snapshot"]  # snapshots stay per event
    assert media["a"]["snapshot_pending"] is media["c"]["snapshot_missing"] is None


def test_snapshot_best_is_the_best_frame_annotated(tmp_path: Path) -> None:
    import cv2

    config = RecordConfig(snapshot="best", clips=_config().clips, retention=ROOMY)
    with Recorder("cam", config, tmp_path, geometry=lambda: [ZONE, LINE]) as rec:
        media = _feed(rec, range(160), {150: "e1"})["e1"]
        _wait(rec, "snapshots_written", 1)
        data = rec.snapshot("e1")
    assert data is not None and Path(str(media["snapshot"])).read_bytes() == data
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR).astype(int)

    def red(y: int, x: int) -> bool:
        patch = image[y - 1:y + 2, x - 1:x + 2].reshape(-1, 3)
        return bool(((patch[:, 2] - patch[:, 1]) > 80).any())

    # Frame 60 scored best: its box (x 70..130) is drawn highlighted, not frame 150's (x 160).
    assert red(120, 70) and red(120, 130)
    assert not red(120, 160) and not red(120, 220)
    assert abs(image[H - 24, W - 24].mean() - 60) <= 4  # and it is frame 60's picture
    b, g, r = image[20, 250]
    assert min(g, r) > 150 and min(g, r) - b > 60  # the zone's outline (after JPEG)
    b, g, r = image[200, 50]
    assert min(b, r) > 150 and min(b, r) - g > 60  # the line
    assert rec.snapshot("unknown") is None


def test_buffer_stays_under_buffer_mb_with_1080p_frames(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    config = RecordConfig(clips=ClipConfig(pre_s=10.0, post_s=1.0, fps=10.0, max_width=None,
                                           buffer_mb=2.0), retention=ROOMY)
    limit = 2 * 1024 * 1024
    peak = 0

    def feed(rec: Recorder, indices: range) -> None:
        nonlocal peak
        for i in indices:
            # Noise in 8x8 blocks: about 250 KB a frame as JPEG, so 2 MiB holds about 8.
            small = rng.integers(0, 255, (135, 240, 3), dtype=np.uint8)
            data = np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)
            rec.offer(Frame(i, time.monotonic(), time.time(), data), i / 10.0,
                      [TrackBox(1, "car", 0.5, (0, 0, 100, 100))])
            if i == 15:
                rec.on_event("e1", "enter", 1, i / 10.0)
            while rec.stats()["queued"]:
                time.sleep(0.001)
            s = rec.stats()
            peak = max(peak, s["buffer_bytes"])
            assert s["ring_bytes"] <= limit

    with Recorder("cam", config, tmp_path) as rec:
        feed(rec, range(30))
        # The clip writer runs at nice +10: on a busy board it may take long to get the CPU,
        # and until it is done its frames count in the buffer (the ring gives way to them).
        _wait(rec, "clips_written", 1, timeout=120)
        feed(rec, range(30, 40))
        stats = rec.stats()
    frame_bytes = stats["ring_bytes"] / max(stats["ring_frames"], 1)
    print(f"\n1080p noise frame: {frame_bytes / 1024:.0f} KiB encoded, ring "
          f"{stats['ring_frames']} frames, peak buffer {peak / 1024:.0f} KiB")
    assert peak <= limit
    assert stats["dropped_buffer"] > 0 and 4 <= stats["ring_frames"] <= 9
    assert stats["encoded"] == 40 and stats["clips_written"] == 1


def test_retention_by_age_and_size_at_start(tmp_path: Path) -> None:
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(b"x" * 1000)
    media = tmp_path / "media"
    (media / "clips").mkdir(parents=True)
    old = media / "clips" / "old.jpg"
    old.write_bytes(b"x" * 1000)
    big_old = media / "clips" / "b.webm"  # every clip format is media (VP8 ones were missed)
    big_old.write_bytes(b"x" * 1_000_000)
    big_new = media / "clips" / "c.avi"
    big_new.write_bytes(b"x" * 1_000_000)
    notes = media / "notes.txt"
    notes.write_bytes(b"x" * 3_000_000)
    link = media / "clips" / "link.jpg"
    link.symlink_to(outside)
    now = time.time()
    os.utime(old, (now - 10 * 86400, now - 10 * 86400))
    os.utime(big_old, (now - 3600, now - 3600))
    os.utime(big_new, (now - 60, now - 60))
    config = RecordConfig(retention=RetentionConfig(max_mb=1.5, max_age_h=24, min_free_mb=0.01))
    with Recorder("cam", config, media) as rec:
        stats = rec.stats()
    assert not old.exists() and not big_old.exists()  # too old; then the oldest over 1.5 MiB
    assert big_new.exists() and notes.exists() and link.is_symlink() and outside.exists()
    assert stats["deleted"] == 2 and stats["bytes_on_disk"] == 1_000_000


def test_retention_after_writes_keeps_the_newest(tmp_path: Path) -> None:
    store = MediaStore(tmp_path, RetentionConfig(max_mb=0.05, max_age_h=None, min_free_mb=0.01))
    store.prepare()
    for i in range(5):
        assert store.write_bytes(store.snapshots / f"s{i}.jpg", b"x" * 20_000)
        os.utime(store.snapshots / f"s{i}.jpg", (1000.0 + i, 1000.0 + i))
    assert sorted(p.name for p in store.snapshots.iterdir()) == ["s3.jpg", "s4.jpg"]
    assert store.deleted == 3 and store.bytes_on_disk == 40_000


def test_low_disk_skips_writes(tmp_path: Path) -> None:
    config = RecordConfig(clips=ClipConfig(pre_s=0.5, post_s=0.5, max_width=None),
                          retention=RetentionConfig(min_free_mb=1_048_576))
    with Recorder("cam", config, tmp_path) as rec:
        media = _feed(rec, range(60), {10: "e1"})["e1"]
        _wait(rec, "skipped_low_disk", 2)
        stats = rec.stats()
    assert media["snapshot"] is None and not Path(str(media["snapshot_pending"])).exists()
    assert "retention.min_free_mb" in str(media["snapshot_missing"])  # why, on the event
    assert not Path(str(media["clip"])).exists()
    assert stats["skipped_low_disk"] == 2  # the snapshot and the clip
    assert stats["snapshots_written"] == stats["clips_written"] == 0


def test_codec_probe_and_explicit_format(tmp_path: Path) -> None:
    fmt = probe_format("auto")
    assert fmt is not None and fmt.name in FORMAT_NAMES
    print(f"\nclip format here: {fmt.name} ({fmt.fourccs[0]})")
    chosen = next(n for n in AUTO_ORDER if FORMATS[n].name == fmt.name)
    # auto keeps the first of the order that works: every earlier one does not work here.
    assert not any(_works(n) for n in AUTO_ORDER[:AUTO_ORDER.index(chosen)])
    if _works("vp8"):
        assert fmt.name in ("h264/mp4", "vp8/webm")  # a browser plays it; mp4v is not chosen
    entries = [Entry(encode_jpeg(_frame(i)[0].data, 90), i / 200.0, 0.0, i, (), 1.0)
               for i in range(0, 200, 20)]  # ten frames 0.1 s apart
    path = tmp_path / f"auto.{fmt.ext}"
    assert write_clip(path, fmt, entries, (), None, 10.0) == pytest.approx(10.0)
    values, fps = _read_clip(str(path))
    assert len(values) == 10 and abs(fps - 10.0) < 0.5
    assert all(abs(v - i) <= 4 for v, i in zip(values, range(0, 200, 20), strict=True)), values
    with Recorder("cam", _config(format="mjpeg"), tmp_path) as rec:
        media = _feed(rec, range(110), {40: "e1"})["e1"]
        _wait(rec, "clips_written", 1)
    assert media["clip_format"] == "mjpeg/avi" and str(media["clip"]).endswith("e1.avi")
    values, _ = _read_clip(str(media["clip"]))
    assert abs(values[0] - 10) <= 4 and abs(values[-1] - 100) <= 4, values


def test_event_types_and_switches(tmp_path: Path) -> None:
    config = RecordConfig(snapshots=False, clips=None, events=["cross"], retention=ROOMY)
    with Recorder("cam", config, tmp_path) as rec:
        _feed(rec, range(10))
        assert rec.on_event("e1", "enter", 1, 0.3) == {
            "snapshot": None, "snapshot_pending": None, "snapshot_missing": None, "clip": None,
            "clip_format": None, "clip_missing": None, "clip_remux": None}
        assert rec.on_event("e2", "cross", 1, 0.3)["snapshot"] is None
        assert rec.stats()["kept"] == 0  # nothing to record: no frame is kept
    snaps = RecordConfig(snapshot="best", clips=None, events=["exit"], retention=ROOMY)
    with Recorder("cam", snaps, tmp_path) as rec:
        _feed(rec, range(30))
        media = rec.on_event("../x y", "exit", 7, 1.0)  # a track never seen: the latest frame
        _wait(rec, "snapshots_written", 1)
    assert media["clip"] is None
    assert media["snapshot"] == str(tmp_path / "snapshots" / "_.._x_y.jpg")
    assert Path(str(media["snapshot"])).parent == tmp_path / "snapshots"
    assert rec.snapshot("../x y") is not None
    own = RecordConfig(clips=None, events=["exit"], retention=ROOMY)
    with Recorder("cam", own, tmp_path / "own") as rec:
        _feed(rec, range(30))
        media = rec.on_event("x", "exit", 7, 1.0)  # never seen: no last frame to show
        _wait(rec, "snapshots_missed", 1)
    assert media["snapshot"] is None and media["snapshot_pending"] is None
    assert "track #7 was in no kept frame" in str(media["snapshot_missing"])


def test_offer_cost(tmp_path: Path) -> None:
    frame, box = _frame(0)
    boxes = [box]
    with Recorder("cam", _config(), tmp_path) as rec:
        n = 200_000
        t0 = time.perf_counter()
        for i in range(n):
            rec.offer(frame, i * 1e-7, boxes)  # 0.02 s of clock: one frame kept
        per_call = (time.perf_counter() - t0) / n
        assert rec.stats()["kept"] == 1
    print(f"\noffer() of a frame not kept: {per_call * 1e6:.2f} us")


def test_start_twice_is_refused(tmp_path: Path) -> None:
    from edgeinfer.errors import StateError

    rec = Recorder("cam", _config(), tmp_path)
    rec.start()
    with pytest.raises(StateError):
        rec.start()
    rec.close()
    rec.close()


def test_a_failing_frame_does_not_end_recording(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import edgeinfer.analytics.recorder as recorder

    real = recorder.encode_jpeg
    calls = {"n": 0}

    def flaky(image: np.ndarray, quality: int) -> bytes:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("a bug in encoding one frame")
        return real(image, quality)

    monkeypatch.setattr(recorder, "encode_jpeg", flaky)
    with Recorder("p", _config(), tmp_path) as rec:
        _feed(rec, range(0, 60))
        _wait(rec, "encoded", 15)
        stats = rec.stats()
    assert stats["errors"] == 1 and stats["encoded"] >= 15


def _nice(tid: int) -> int:
    """A thread's nice value: field 19 of ``/proc/self/task/<tid>/stat``."""
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])  # fields after the name start at 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_media_threads_run_at_lower_priority(tmp_path: Path) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with Recorder("lowprio", _config(), tmp_path) as rec:
        _feed(rec, range(3))  # the encoder has run: it lowered its priority before the loop
        threads = {t.name: t.native_id for t in threading.enumerate()}
        enc, write = threads["rec-enc-lowprio"], threads["rec-write-lowprio"]
        assert enc is not None and write is not None
        end = time.monotonic() + 2.0
        while _nice(write) == base and time.monotonic() < end:
            time.sleep(0.005)
        nices = _nice(enc), _nice(write), os.getpriority(os.PRIO_PROCESS, write)
    assert nices == (min(base + 5, 19), min(base + 10, 19), min(base + 10, 19))
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # only theirs


@pytest.mark.parametrize("size", [(640, 480), (1280, 720)])
def test_clip_writing_cost_per_format(tmp_path: Path, size: tuple[int, int]) -> None:
    """What one clip frame costs the writer thread (JPEG decode, drawing, encoding) per format;
    printed with ``-s``. Frames: a smooth textured scene with a moving box, like a camera's."""
    import cv2

    w, h = size
    rng = np.random.default_rng(1)
    scene = cv2.GaussianBlur(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), (0, 0), 3)
    n = 12
    entries = []
    for i in range(n):
        image = scene.copy()
        x = 20 + 15 * i
        image[100:260, x:x + 120] = (190, 170, 150)
        box = TrackBox(1, "person", 0.8, (x, 100, x + 120, 260))
        entries.append(Entry(encode_jpeg(image, 75), i / 10.0, 0.0, i, (box,), 1.0))
    costs = {}
    for name in AUTO_ORDER:
        if not _works(name):
            continue
        fmt = FORMATS[name]
        path = tmp_path / f"{name}-{w}.{fmt.ext}"
        t0 = time.perf_counter()
        write_clip(path, fmt, entries, (ZONE,), 1, 10.0)
        costs[fmt.name] = (time.perf_counter() - t0) / n
        values, _ = _read_clip(str(path))
        assert len(values) == n
        costs[fmt.name + " KiB"] = path.stat().st_size / n / 1024
    print(f"\nclip writing at {w}x{h}: " + ", ".join(
        f"{k} {v:.1f}" if k.endswith("KiB") else f"{k} {v * 1000:.1f} ms/frame"
        for k, v in costs.items()))
    assert "mjpeg/avi" in costs and all(v > 0 for v in costs.values())


def test_close_cuts_a_long_clip_short_instead_of_waiting(tmp_path: Path) -> None:
    rec = Recorder("p", _config(pre_s=1.0, post_s=60.0), tmp_path)
    rec.start()
    media = _feed(rec, range(0, 90), events={45: "ev"})
    started = time.monotonic()
    rec.close(timeout=0.0)
    took = time.monotonic() - started
    assert took < 5.0 and not any(t.is_alive() for t in rec._threads)
    frames, _ = _read_clip(str(media["ev"]["clip"]))
    assert frames  # a valid, shorter clip


def test_an_event_whose_frames_were_dropped_still_gets_a_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved encoder (a busy board) drops the queued frames an event came with; the event's
    snapshot then takes the next frame encoded instead of being missed."""
    import edgeinfer.analytics.recorder as recorder

    monkeypatch.setattr(recorder, "_lower_priority", lambda increment: time.sleep(0.5))
    rec = Recorder("p", _config(), tmp_path)
    rec.start()
    media = {}
    for i in range(30):  # all offered before the encoder thread runs: most are dropped
        frame, box = _frame(i)
        rec.offer(frame, i / FPS * 3, [box])
        if i == 10:
            media = rec.on_event("ev", "enter", 1, i / FPS * 3)
    rec.close()
    stats = rec.stats()
    assert stats["dropped_queue"] > 0 and stats["snapshots_missed"] == 0
    assert Path(str(media["snapshot"])).is_file()


def _grey(data: bytes) -> float:
    """The corner grey level of a JPEG snapshot (the index of the frame it shows)."""
    import cv2

    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return float(image[H - 24, W - 24].mean())


def test_snapshot_event_shows_the_events_own_frame_and_is_named_once_written(
        tmp_path: Path) -> None:
    """The snapshot was the track's best frame (an ``enter`` could show the object before it
    entered) and the event named its path before the file existed."""
    with Recorder("cam", _config(), tmp_path) as rec:
        _feed(rec, range(151))
        media = rec.on_event("e1", "enter", 1, 151 / FPS)  # frame 151: between kept frames
        pending = media["snapshot_pending"]
        assert media["snapshot"] is None and media["snapshot_missing"] is None
        assert isinstance(pending, str) and not Path(pending).exists()
        frame, box = _frame(151)
        frame.data[H - 48:, W - 48:] = 250  # this frame only
        rec.offer(frame, 151 / FPS, [box])
        _feed(rec, range(152, 160))
        _wait(rec, "snapshots_written", 1)
    assert media["snapshot"] == pending and media["snapshot_pending"] is None
    assert abs(_grey(Path(pending).read_bytes()) - 250) <= 4  # not frame 60, the best


def test_exit_snapshot_is_the_last_frame_the_track_was_seen_in(tmp_path: Path) -> None:
    config = RecordConfig(clips=_config().clips, events=["exit"], retention=ROOMY)
    with Recorder("cam", config, tmp_path) as rec:
        _feed(rec, range(100))  # the track is in frames 0..99 (frame 60 scores best)
        for i in range(100, 130):  # then gone; the tracker ends it at frame 129
            rec.offer(_frame(i)[0], i / FPS, [])
        media = rec.on_event("gone", "exit", 1, 129 / FPS)
        _wait(rec, "snapshots_written", 1)
    assert media["snapshot_missing"] is None, media
    assert abs(_grey(Path(str(media["snapshot"])).read_bytes()) - 99) <= 4  # frame 99


def test_a_clip_being_written_does_not_delay_a_snapshot(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots waited in the writer's queue behind clips: with a 60 s clip being encoded,
    the newest events had no image for tens of seconds. The gate holds the first clip's
    writing (as a long VP8 clip on a small board does) while a second event comes."""
    import edgeinfer.analytics.clipwriter as recorder  # the clip writer calls write_clip

    gate = threading.Event()
    real = recorder.write_clip

    def slow_clip(*args: object, **kwargs: object) -> float:
        gate.wait(30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(recorder, "write_clip", slow_clip)
    with Recorder("cam", _config(pre_s=0.5, post_s=0.5), tmp_path) as rec:
        try:
            _feed(rec, range(60), {30: "first"})  # its clip ends at frame 45: being written
            second = _feed(rec, range(60, 100), {90: "second"})["second"]
            _wait(rec, "snapshots_written", 2)
            assert rec.stats()["clips_written"] == 0  # the first clip is still being written
            assert second["snapshot"] is not None and Path(str(second["snapshot"])).is_file()
        finally:
            gate.set()


@contextlib.contextmanager
def _no_fds_left() -> Iterator[list[int]]:
    """This process with no file descriptor left (a real ``EMFILE``): the limit lowered to what
    is open and the rest taken by ``/dev/null``; closing some of the yielded fds frees them."""
    import resource

    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16,
                                                limits[1]))
    fds: list[int] = []
    try:
        with contextlib.suppress(OSError):
            while True:
                fds.append(os.open(os.devnull, os.O_RDONLY))
        yield fds
    finally:
        while fds:
            os.close(fds.pop())
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts fds in /proc")
@pytest.mark.parametrize("freed", [True, False])
def test_no_file_descriptor_left_retries_then_says_why(tmp_path: Path, freed: bool) -> None:
    """Under a flood of web clients opening a file fails with EMFILE for a moment: the
    snapshot was lost (a warning in the log, the event still naming the path)."""
    with Recorder("cam", _config(), tmp_path) as rec:
        _feed(rec, range(30))
        with _no_fds_left() as fds:
            media = _feed(rec, range(30, 40), {33: "flood"})["flood"]
            _wait(rec, "write_retries", 1)
            assert rec.stats()["write_retries"] >= 1
            if freed:  # the flood passes while the writer retries
                while fds:
                    os.close(fds.pop())
            _wait(rec, "snapshots_written" if freed else "snapshots_missed", 1)
    if freed:
        assert media["snapshot_missing"] is None and Path(str(media["snapshot"])).is_file()
    else:
        assert media["snapshot"] is None and not Path(str(media["snapshot_pending"])).exists()
        assert "EMFILE" in str(media["snapshot_missing"]), media


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts fds in /proc")
@pytest.mark.parametrize("freed", [True, False])
def test_a_clip_that_cannot_be_opened_is_retried_then_says_why(tmp_path: Path,
                                                                freed: bool) -> None:
    """OpenCV cannot open a clip file while no descriptor is left (EMFILE): the clip was lost
    with a warning, its events still naming it."""
    config = RecordConfig(snapshots=False, clips=_config(pre_s=0.5, post_s=0.5).clips,
                          retention=ROOMY)
    with Recorder("cam", config, tmp_path) as rec:
        media = _feed(rec, range(30), {15: "ev"})["ev"]  # its clip ends at frame 30
        with _no_fds_left() as fds:
            _feed(rec, range(30, 40))  # the clip is complete: written with no fd left
            _wait(rec, "write_retries", 1)
            assert rec.stats()["write_retries"] >= 1
            if freed:
                while fds:
                    os.close(fds.pop())
            _wait(rec, "clips_written" if freed else "clips_missed", 1)
    if freed:
        assert media["clip_missing"] is None and Path(str(media["clip"])).is_file()
    else:
        assert media["clip"] is None and "cannot write clip" in str(media["clip_missing"])
        assert not list((tmp_path / "clips").iterdir())


def test_more_event_frames_than_wait_for_the_encoder_all_get_snapshots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Event frames are never dropped for a lagging encoder up to 16 waiting; past that the
    oldest is, and its events take the next frame encoded: none is missed."""
    import edgeinfer.analytics.recorder as recorder

    monkeypatch.setattr(recorder, "_lower_priority", lambda increment: time.sleep(0.5))
    rec = Recorder("p", _config(), tmp_path)
    rec.start()
    media = []
    for i in range(24):  # all offered before the encoder thread runs, each with an event
        media.append(rec.on_event(f"ev{i}", "enter", 1, i / FPS))
        frame, box = _frame(i)
        rec.offer(frame, i / FPS, [box])
    rec.close()
    stats = rec.stats()
    assert stats["dropped_queue"] <= 24 - 16 and stats["snapshots_missed"] == 0  # 8 unless
    # the encoder woke before all were offered
    assert stats["snapshots_written"] == 24
    assert all(m["snapshot"] and Path(str(m["snapshot"])).is_file() for m in media)
