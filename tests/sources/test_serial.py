"""The serial source through pyserial on a real pseudo-terminal pair."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgeinfer.config.pipeline import ReconnectConfig
from edgeinfer.config.pipeline import SerialSource as SerialConfig
from edgeinfer.errors import SourceError
from edgeinfer.sources import open_source
from edgeinfer.testing.sensors import PtySensor, take

pytest.importorskip("serial")

FAST = ReconnectConfig(initial_s=0.02, max_s=0.1)


def _wait(predicate, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_csv_lines_become_windows_and_bad_lines_are_counted() -> None:
    lines = ["1,10", "2,20", "temp,hum", "3,30", "4", "5,50,500", "6,x", "nan,1", "",
             "7,70\r", " 8 , 80 ", "9,90"]
    with PtySensor() as sensor:
        config = SerialConfig(port=sensor.port, fields=["t", "h"], window=3, hop=2, reconnect=FAST)
        with open_source(config) as src:
            writer = sensor.stream(lines, interval_s=0.002)
            frames = take(src, 2, timeout_s=5)
            writer.join()
    # readings 1, 2, 3, 7, 8, 9 -> windows [1 2 3], [3 7 8] (and [8 9 .], incomplete)
    assert [f.data[:, 0].tolist() for f in frames] == [[1, 2, 3], [3, 7, 8]]
    np.testing.assert_array_equal(frames[0].data[:, 1], [10, 20, 30])
    f = frames[0]
    assert f.kind == "series" and f.fields == ("t", "h") and f.data.dtype == np.float32
    assert f.index == 0 and frames[1].index == 1 and 0 <= f.start <= frames[1].start
    assert src.stats.corrupt == 5  # header, too few, too many, not a number, nan
    assert src.stats.frames == len(frames) and src.stats.errors == 0


def test_json_lines_take_the_fields_in_order() -> None:
    lines = ['{"hum": 40, "temp": 21.5, "id": "a"}', '{"temp": 22}', '{"temp": "hot", "hum": 1}',
             '{"temp": true, "hum": 1}', "not json", "[1, 2]", '{"temp": 23, "hum": 42}']
    with PtySensor() as sensor:
        config = SerialConfig(port=sensor.port, format="json", fields=["temp", "hum"], window=2)
        with open_source(config) as src:
            sensor.write_lines(lines)
            frames = take(src, 1, timeout_s=5)
    np.testing.assert_array_equal(frames[0].data, [[21.5, 40], [1, 2]])
    assert frames[0].fields == ("temp", "hum")
    assert src.stats.corrupt == 4


def test_columns_are_inferred_without_fields() -> None:
    with PtySensor() as sensor, open_source(SerialConfig(port=sensor.port, window=2)) as src:
        sensor.write_lines(["1,2,3", "4,5", "6,7,8"])
        frames = take(src, 1, timeout_s=5)
    assert frames[0].fields == ("c0", "c1", "c2")
    np.testing.assert_array_equal(frames[0].data, [[1, 2, 3], [6, 7, 8]])
    assert src.stats.corrupt == 1


def test_unplugged_sensor_is_reopened_when_it_comes_back(tmp_path: Path) -> None:
    sensor = PtySensor(link=tmp_path / "ttyUSB0")
    config = SerialConfig(port=sensor.port, window=2, reconnect=FAST)
    frames: list = []  # type: ignore[type-arg]
    with open_source(config) as src:
        reader = threading.Thread(target=lambda: frames.extend(take(src, 2, timeout_s=10)))
        reader.start()
        sensor.write_lines(["1", "2", "3"])  # "3" is a partial window when the cable goes
        assert _wait(lambda: len(frames) == 1 or src.stats.frames == 1)
        time.sleep(0.05)
        sensor.unplug()
        assert _wait(lambda: src.stats.reconnects >= 2)  # it keeps trying while it is away
        sensor.plug()
        # pyserial flushes the input when it opens the port: repeat until it is read
        while reader.is_alive():
            sensor.write("4\n5\n")
            reader.join(0.05)
    sensor.close()
    assert [f.data[:, 0].tolist() for f in frames] == [[1, 2], [4, 5]]
    assert "cannot open" in src.stats.last_error


def test_missing_port_gives_up_naming_it(tmp_path: Path) -> None:
    port = str(tmp_path / "ttyACM9")
    config = SerialConfig(port=port, reconnect=ReconnectConfig(initial_s=0.01, max_attempts=1))
    with open_source(config) as src, pytest.raises(SourceError, match="ttyACM9"):
        list(src)
    assert src.stats.errors == 1 and src.stats.reconnects == 0  # max_attempts=1: no retry


def test_stop_is_prompt_on_a_quiet_line() -> None:
    with PtySensor() as sensor, open_source(SerialConfig(port=sensor.port)) as src:
        threading.Timer(0.2, src.stop).start()
        t0 = time.monotonic()
        assert list(src) == []
        assert time.monotonic() - t0 < 20.0  # a quiet line never ends by itself: stop() ended it


def test_missing_pyserial_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "serial", None)
    with pytest.raises(SourceError, match=r"pip install 'edgeinfer\[serial\]'"):
        open_source(SerialConfig(port="/dev/ttyUSB0")).__enter__()
