"""Counters: totals persist across restarts, throttled saving, reset, corrupt files."""

from __future__ import annotations

import json
import logging
import stat
import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.analytics.counters import CounterStore
from edgeinfer.analytics.scene import Scene
from edgeinfer.config.analytics import LineConfig, ZoneConfig

ZONE = ZoneConfig(name="door", points=[[100, 100], [300, 100], [300, 300], [100, 300]],
                  coordinates="pixels")
LINE = LineConfig(name="gate", points=[[100, 240], [500, 240]], coordinates="pixels")


_STORES: list[CounterStore] = []


def _store(path: Path, **kw: float) -> CounterStore:
    """A store the test's reads of the file wait for (saves are written by a thread)."""
    store = CounterStore(path, **kw)
    _STORES.append(store)
    return store


def make(path: Path, zones: list[ZoneConfig] | None = None,
         lines: list[LineConfig] | None = None) -> Scene:
    scene = Scene([ZONE] if zones is None else zones, [LINE] if lines is None else lines,
                  class_names=["person"], counters=_store(path))
    scene.bind(640, 480)
    return scene


def step(scene: Scene, frame: int, *objs: tuple[int, float, float]) -> None:
    ids = np.array([o[0] for o in objs], dtype=np.int64)
    boxes = np.array([[x - 10, y - 40, x + 10, y] for _, x, y in objs],
                     dtype=np.float32).reshape(-1, 4)
    n = len(objs)
    scene.update(frame / 10, 1e9 + frame / 10, frame, ids, boxes, np.zeros(n, np.int64),
                 np.ones(n, np.float32), ["person"] * n, ())


def walk(scene: Scene) -> None:
    """Track 1 enters the zone and stays; track 2 crosses the line downwards."""
    step(scene, 0, (1, 400, 200), (2, 400, 200))
    step(scene, 1, (1, 200, 200), (2, 400, 280))


def on_disk(path: Path) -> dict[str, object]:
    for store in _STORES:
        assert store.flush()
    doc = json.loads(path.read_text())
    return {"zones": doc["zones"], "lines": doc["lines"]}


def test_totals_persist_across_a_new_scene(tmp_path: Path) -> None:
    path = tmp_path / "state" / "analytics" / "cam.json"
    scene = make(path)
    walk(scene)
    # The first change is saved at once; the folder is private, the file too.
    assert on_disk(path) == {"zones": {"door": {"entered": 1, "exited": 0, "loiter": 0}},
                             "lines": {"gate": {"in": 1, "out": 0}}}
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    scene.close()
    again = make(path)
    assert again.counts() == {"zones": {"door": {"occupancy": 0, "entered": 1, "exited": 0,
                                                 "loiter": 0}},
                              "lines": {"gate": {"in": 1, "out": 0}}}
    walk(again)
    again.close()
    assert on_disk(path)["lines"] == {"gate": {"in": 2, "out": 0}}


def test_removed_zone_drops_its_totals_and_a_new_one_starts_at_zero(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    scene = make(path)
    walk(scene)
    scene.close()
    hall = ZoneConfig(name="hall", points=ZONE.points, coordinates="pixels")
    other = make(path, zones=[hall])
    assert other.counts()["zones"] == {"hall": {"occupancy": 0, "entered": 0, "exited": 0,
                                                "loiter": 0}}
    step(other, 0)  # the next frame saves the config's names only
    assert on_disk(path) == {"zones": {"hall": {"entered": 0, "exited": 0, "loiter": 0}},
                             "lines": {"gate": {"in": 1, "out": 0}}}


def test_maybe_save_writes_at_most_once_a_second(tmp_path: Path) -> None:
    store = _store(tmp_path / "c.json")
    counts = {"zones": {}, "lines": {"gate": {"in": 1, "out": 0}}}
    assert store.maybe_save(counts, 100.0)
    counts["lines"]["gate"]["in"] = 2
    assert not store.maybe_save(counts, 100.5)
    assert on_disk(store.path)["lines"] == {"gate": {"in": 1, "out": 0}}
    assert store.maybe_save(counts, 101.0)
    assert on_disk(store.path)["lines"] == {"gate": {"in": 2, "out": 0}}
    mtime = store.path.stat().st_mtime_ns
    assert store.maybe_save(counts, 105.0)  # unchanged: nothing written
    assert store.path.stat().st_mtime_ns == mtime
    assert store.load() == {"zones": {}, "lines": {"gate": {"in": 2, "out": 0}}}


def test_scene_saves_a_pending_change_after_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    scene = Scene([], [LINE], class_names=None, counters=_store(path, interval_s=0.2))
    scene.bind(640, 480)
    step(scene, 0, (1, 300, 200), (2, 300, 200))
    step(scene, 1, (1, 300, 280), (2, 300, 200))
    assert on_disk(path)["lines"] == {"gate": {"in": 1, "out": 0}}
    step(scene, 2, (1, 300, 280), (2, 300, 280))  # within the interval: not written yet
    assert on_disk(path)["lines"] == {"gate": {"in": 1, "out": 0}}
    time.sleep(0.25)
    step(scene, 3)  # no change in this frame, but the pending one goes out
    assert on_disk(path)["lines"] == {"gate": {"in": 2, "out": 0}}


def test_reset_one_all_and_unknown(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    scene = make(path)
    walk(scene)
    assert scene.reset(["gate"]) == ["gate"]
    assert on_disk(path)["lines"] == {"gate": {"in": 0, "out": 0}}
    counts = scene.counts()
    assert counts["zones"]["door"] == {"occupancy": 1, "entered": 1, "exited": 0, "loiter": 0}
    assert not scene.changed
    assert scene.reset() == ["door", "gate"]
    assert scene.changed
    # Occupancy is the present state and stays.
    assert scene.counts()["zones"]["door"] == {"occupancy": 1, "entered": 0, "exited": 0,
                                               "loiter": 0}
    assert on_disk(path)["zones"] == {"door": {"entered": 0, "exited": 0, "loiter": 0}}
    with pytest.raises(ValueError, match="'nope'; valid names: door, gate"):
        scene.reset(["gate", "nope"])


@pytest.mark.parametrize("content", [b"{not json", b'{"zones": {}, "lines": {}}',
                                     b'{"format": "edgeinfer-counters", "version": 1, '
                                     b'"zones": {"door": {"entered": -3}}, "lines": {}}',
                                     b"\xff\xfe"])
def test_corrupt_or_foreign_file_is_set_aside(tmp_path: Path, content: bytes,
                                              caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.analytics.counters"):
        scene = make(path)
    assert "unusable" in caplog.text
    aside = list(tmp_path.glob("c.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == content
    assert scene.counts()["lines"]["gate"] == {"in": 0, "out": 0}
    walk(scene)
    assert on_disk(path)["lines"] == {"gate": {"in": 1, "out": 0}}
