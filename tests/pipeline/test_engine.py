"""The pipeline engine with real threads, queues and a real (tiny) ONNX model.

The source here is a plain in-memory Source implementation (a list of frames, paced or not):
the engine's behaviour, not a device's, is what these tests are about.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import EmitConfig, JsonlSink, StdoutSink
from edgeinfer.errors import SourceError
from edgeinfer.frames import Classification, DropFrame, Frame, Result, TaskResult
from edgeinfer.pipeline import Pipeline
from edgeinfer.sinks.jsonl import JsonlSink as JsonlSinkImpl
from edgeinfer.sinks.stdout import StdoutSink as StdoutSinkImpl
from edgeinfer.sources.base import Source
from edgeinfer.tasks.base import Task
from edgeinfer.testing import onnx_models as om


class ListSource(Source):
    """Yields ``n`` 4x4 frames whose pixels hold their index; ``interval`` paces them."""

    def __init__(self, n: int, *, live: bool = False, interval: float = 0.0,
                 fail_after: int | None = None) -> None:
        super().__init__(None)
        self.live = live
        self.n, self.interval, self.fail_after = n, interval, fail_after
        self.closed = False

    def _open(self) -> None:
        pass

    def _frames(self) -> Iterator[Frame]:
        for i in range(self.n):
            if self.stopped:
                return
            if self.fail_after is not None and i == self.fail_after:
                raise SourceError("camera /dev/video9 gave up after 3 attempts")
            if self.interval:
                time.sleep(self.interval)
            self.stats.frames += 1
            yield Frame(i, time.monotonic(), time.time(), np.full((4, 4, 3), i % 256, np.uint8))

    def _close(self) -> None:
        self.closed = True


class MeanTask(Task):
    """Feeds the frame's mean pixel as x[1, 4]; reports y[0, 0] (= mean + 1) as the output.
    ``slow`` sleeps in the inference thread; ``every`` changes the change-key every n frames."""

    def __init__(self, model: Any, *, slow: float = 0.0, every: int = 1,
                 drop_odd: bool = False) -> None:
        super().__init__(None, model)
        self.slow, self.every, self.drop_odd = slow, every, drop_odd

    def preprocess(self, frame: Frame) -> tuple[dict[str, np.ndarray], Any]:
        if self.drop_odd and frame.index % 2:
            raise DropFrame
        return {"x": np.full((1, 4), frame.data[0, 0, 0], np.float32)}, frame.index // self.every

    def inject_state(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.slow:
            time.sleep(self.slow)
        return feeds

    def postprocess(self, outputs: Mapping[str, np.ndarray], frame: Frame, context: Any
                    ) -> TaskResult:
        return TaskResult(outputs={"y": float(outputs["y"][0, 0]), "bucket": context})


@pytest.fixture
def model(tmp_path: Path):  # type: ignore[no-untyped-def]
    m = edgeinfer.load_model(om.add_model(tmp_path / "add.onnx"), name="add", version="1")
    yield m
    m.close()


def collect(pipeline: Pipeline) -> list[Result]:
    return list(pipeline)


def test_file_source_processes_every_frame_in_order(model) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("p", ListSource(60), model, MeanTask(model), [], queue_size=2)
    results = collect(p)
    assert [r.seq for r in results] == list(range(1, 61))
    assert [r.frame.index for r in results] == list(range(60))
    assert [r.task.outputs["y"] for r in results] == [float(i + 1) for i in range(60)]
    snap = p.snapshot()
    assert snap["processed"] == 60 and snap["dropped"]["queue"] == 0 and snap["state"] == "done"
    assert p.source.closed and model.closed  # the pipeline closes what it was given


def test_live_source_drops_oldest_when_inference_falls_behind(model) -> None:  # type: ignore[no-untyped-def]
    source = ListSource(80, live=True, interval=0.002)
    p = Pipeline("live", source, model, MeanTask(model, slow=0.02), [], queue_size=2)
    results = collect(p)
    snap = p.snapshot()
    assert snap["dropped"]["queue"] > 20
    assert snap["frames_in"] == snap["processed"] + snap["dropped"]["queue"]
    indices = [r.frame.index for r in results]
    assert indices == sorted(indices) and indices[-1] == 79  # fresh frames, still in order


def test_emit_on_change(model) -> None:  # type: ignore[no-untyped-def]
    class Keyed(MeanTask):  # the top class changes every 10 frames
        def postprocess(self, outputs, frame, context):  # type: ignore[no-untyped-def]
            return TaskResult(top=(Classification(str(context), context, 1.0),))

    p = Pipeline("c", ListSource(40), model, Keyed(model, every=10), [],
                 emit=EmitConfig(mode="change"))
    results = collect(p)
    assert [r.frame.index for r in results] == [0, 10, 20, 30]
    assert [r.seq for r in results] == [1, 2, 3, 4]


def test_min_interval_holds_the_newest_and_flushes_at_the_end(tmp_path: Path) -> None:
    m = edgeinfer.load_model(om.add_model(tmp_path / "a.onnx"))
    p = Pipeline("i", ListSource(30, live=False, interval=0.005), m, MeanTask(m), [],
                 emit=EmitConfig(min_interval_s=0.05))
    results = collect(p)
    assert 2 <= len(results) < 30
    assert results[-1].frame.index == 29  # the held newest one is not lost at the end
    gaps = [b.frame.ts - a.frame.ts for a, b in zip(results[:-1], results[1:-1])]
    assert min(gaps) >= 0.05 - 1e-3  # the last one is the end-of-stream flush


def test_dropframe_and_inference_errors_are_counted_not_fatal(tmp_path: Path) -> None:
    m = edgeinfer.load_model(om.add_model(tmp_path / "a.onnx"))

    class Flaky(MeanTask):
        def preprocess(self, frame):  # type: ignore[no-untyped-def]
            feeds, ctx = super().preprocess(frame)
            if frame.index == 4:  # a wrong dtype: onnxruntime refuses it
                feeds = {"x": np.zeros((1, 4), np.float64)}
            return feeds, ctx

    p = Pipeline("f", ListSource(20), m, Flaky(m, drop_odd=True), [])
    results = collect(p)
    snap = p.snapshot()
    assert snap["dropped"]["task"] == 10 and snap["errors"] == 1
    assert [r.frame.index for r in results] == [0, 2, 6, 8, 10, 12, 14, 16, 18]
    assert "expected dtype float32" in snap["last_error"]


def test_source_failure_ends_the_pipeline_with_its_error(model) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("s", ListSource(50, fail_after=10), model, MeanTask(model), [])
    with pytest.raises(SourceError, match="/dev/video9"):
        p.run()
    assert p.snapshot()["state"] == "failed"
    assert p.snapshot()["processed"] == 10


def test_sinks_and_callback_receive_every_result(model, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    out = tmp_path / "r" / "results.jsonl"
    sinks = [JsonlSinkImpl(JsonlSink(path=str(out))), StdoutSinkImpl(StdoutSink())]
    p = Pipeline("sink", ListSource(5), model, MeanTask(model), sinks,
                 on_result=lambda r: seen.append(r.seq))
    p.run()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["seq"] for d in lines] == [1, 2, 3, 4, 5] == seen
    first = lines[0]
    assert first["pipeline"] == "sink" and first["model"]["name"] == "add"
    assert first["model"]["version"] == "1" and len(first["model"]["sha256"]) == 64
    assert first["frame"] == {"index": 0, "ts": first["frame"]["ts"], "width": 4, "height": 4}
    assert set(first["latency_ms"]) == {"pre", "infer", "post"}
    assert first["provider"] == "CPUExecutionProvider" and first["outputs"]["y"] == 1.0
    text = capsys.readouterr().out.splitlines()
    assert len(text) == 5 and text[0].startswith("sink #1 frame 0")


def test_swap_model_between_frames(tmp_path: Path) -> None:
    old = edgeinfer.load_model(om.add_model(tmp_path / "a.onnx"), name="m", version="1")
    new = edgeinfer.load_model(om.add_model(tmp_path / "b.onnx"), name="m", version="2")
    versions: list[str | None] = []
    swapped = threading.Event()
    p = Pipeline("swap", ListSource(200, interval=0.001), old, MeanTask(old), [],
                 on_result=lambda r: versions.append(r.model.version))

    def swap_midway() -> None:
        while len(versions) < 50:
            time.sleep(0.001)
        p.swap_model(new, MeanTask(new)).close()
        swapped.set()

    t = threading.Thread(target=swap_midway)
    t.start()
    p.run()
    t.join()
    assert swapped.is_set()
    first_new = versions.index("2")
    assert set(versions[:first_new]) == {"1"} and set(versions[first_new:]) == {"2"}
    assert len(versions) == 200  # the stream did not stop


def test_stopping_early_while_iterating(model) -> None:  # type: ignore[no-untyped-def]
    p = Pipeline("it", ListSource(10_000, live=True), model, MeanTask(model), [])
    for n, _ in enumerate(p, 1):
        if n == 5:
            p.stop()
    assert p.snapshot()["state"] == "done" and p.source.closed


def test_every_result_of_a_one_picture_source_reaches_the_iterator(
        tmp_path: Path, blazeface_path: Path) -> None:
    """The README's loop over a source that ends at once: a capture stage that finished before
    the other stages were started used to end the pipeline with nothing emitted (9-22 of 20-30
    runs lost their only result). 200 runs, each result reaching both the iterator and
    ``on_result``."""
    from PIL import Image

    folder = tmp_path / "one"
    folder.mkdir()
    Image.new("RGB", (32, 24), (90, 120, 200)).save(folder / "a.png")
    config = tmp_path / "config.yaml"
    config.write_text(f"""
pipelines:
  - name: one
    source: {{type: images, uri: {folder}}}
    model: {{path: {blazeface_path}}}
    task: {{type: detect, decoder: blazeface}}
""")
    lost = []
    for run in range(200):
        called: list[Result] = []
        got = list(Pipeline.from_config(str(config), on_result=called.append))
        if len(got) != 1 or len(called) != 1:
            lost.append((run, len(got), len(called)))
    assert lost == []
