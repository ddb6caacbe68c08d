"""A result's JSON is encoded once, however many sinks write it, and a changed copy
(``dataclasses.replace``, as the MQTT sink renumbers ``seq``) is encoded afresh."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from edgeinfer.config.pipeline import JsonlSink as JsonlConfig
from edgeinfer.frames import Detection, Frame, ModelRef, Result, TaskResult
from edgeinfer.sinks.jsonl import JsonlSink


def result(seq: int = 7) -> Result:
    frame = Frame(3, time.monotonic(), time.time(), np.zeros((72, 128, 3), np.uint8))
    dets = (Detection("face", 0, 0.9, (1.0, 2.0, 30.0, 40.0), track_id=1),)
    return Result(seq=seq, ts=time.time(), pipeline="cam", frame=frame,
                  model=ModelRef("m", "1", "ab" * 32), provider="cpu",
                  latency_ms=(1.0, 2.0, 3.0), task=TaskResult(detections=dets), run_id="r")


def test_two_sinks_write_the_bytes_encoded_once(tmp_path: Path) -> None:
    r = result()
    first = r.to_json()
    assert r.to_json() is first  # the second sink gets the same bytes, not a new encoding
    sinks = [JsonlSink(JsonlConfig(path=str(tmp_path / f"{i}.jsonl"))) for i in range(2)]
    for sink in sinks:
        sink.open()
        sink.write(r)
        sink.close()
    lines = [(tmp_path / f"{i}.jsonl").read_bytes() for i in range(2)]
    assert lines[0] == lines[1] == first + b"\n"
    assert json.loads(first)["detections"][0]["track_id"] == 1
    assert dataclasses.replace(r) == r  # the cache (set on r, not on the copy) is no field
    assert "_json" not in repr(r)


def test_a_replaced_result_is_encoded_again() -> None:
    r = result(7)
    r.to_json()
    moved = dataclasses.replace(r, seq=107)
    assert json.loads(moved.to_json())["seq"] == 107
    assert json.loads(r.to_json())["seq"] == 7
