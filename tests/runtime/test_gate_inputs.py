"""The selector's correctness gate on outputs near zero, the inputs it judges on, and the sizes
it measures at (issue 30, items 5 and 6).

Real models: the PP-OCRv4 text detector (RapidOCR's wheel), whose probability map on seeded
random input at 480x64 is all under 1e-7, and dynamic-size convolutions built with onnx.helper in
the layout an Ultralytics export has (``?x3x?x?``, ``imgsz`` in its metadata). The one planted
fault is a real onnxruntime session whose outputs gain a region that is not in the reference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgeinfer
from edgeinfer.runtime import select
from edgeinfer.runtime.base import Choice, Session, SessionSpec
from edgeinfer.runtime.decision import Row
from edgeinfer.runtime.gate import OutputsGate, compare_arrays
from edgeinfer.model.samples import local_photos, sample_images, samples_dir
from edgeinfer.runtime.timing import pick_reason

TEXT_LINE = {"x": [1, 3, 64, 480]}
CPU = "CPUExecutionProvider"
PHOTOS_DIR = samples_dir()  # the real cache, read before each test points the cache elsewhere


@pytest.fixture
def photos(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample photographs on the device (fetched once, pinned by sha256)."""
    monkeypatch.setenv("EDGEINFER_SAMPLES", str(PHOTOS_DIR))
    sample_images()
    assert len(local_photos()) == 4


class _Blotched:
    """A real onnxruntime session whose every float output gains a blotch of 0.05 over a
    tenth of its values: a text region that is not there, far beyond rounding."""

    def __init__(self, inner: Session) -> None:
        self._inner = inner
        self.inputs, self.outputs, self.report = inner.inputs, inner.outputs, inner.report

    @property
    def provider(self) -> str:
        return self._inner.provider

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for k, v in self._inner.run(feeds).items():
            flat = v.copy().reshape(-1)
            flat[: max(1, flat.size // 10)] += np.float32(0.05)
            out[k] = flat.reshape(v.shape)
        return out

    def close(self) -> None:
        self._inner.close()


def test_an_output_all_near_zero_refuses_no_correct_candidate_and_still_a_wrong_one(
        tmp_path: Path, ppocr_det_path: Path) -> None:
    """Seeded random input at 480x64: the map is all under 1e-7 and two fp32 kernels agree at
    cosine 0.4-0.8 (noise); the optimized graph was refused for it and the basic graph served
    (23.5 ms against 15.6). An error under the noise floor passes; a blotch does not."""
    with edgeinfer.load_model(ppocr_det_path, input_shapes=TEXT_LINE, probe=False,
                              state_dir=tmp_path / "s") as m:
        spec: SessionSpec = m.spec.replace(threads=2)
    good = Choice("onnxruntime", CPU, "fp32", 1, "all", False)
    wrong = Choice("onnxruntime", CPU, "fp32", 2, "all", False)

    def opener(s: SessionSpec, c: Choice) -> Session:
        session = select.open_choice(s, c)
        return _Blotched(session) if c == wrong else session

    decision, session = select.measure(spec, OutputsGate(), opener=opener,
                                       choices=[good, wrong], budget_s=6)
    assert session is not None
    session.close()
    rows = {r.choice: r for r in decision.rows}
    assert rows[good].status in ("ok", "picked"), rows[good]
    assert rows[wrong].status == "rejected", rows[wrong]
    assert "output" in rows[wrong].reason
    assert decision.choice != wrong
    assert decision.inputs.startswith("seeded random inputs at x 1x3x64x480"), decision.inputs


def test_the_noise_floor_is_absolute_and_scales_with_the_values() -> None:
    rng = np.random.default_rng(3)
    tiny = (rng.random(4096) * 9e-8).astype(np.float32)  # an empty probability map
    other = (rng.random(4096) * 9e-8).astype(np.float32)  # its rounding, uncorrelated
    gate = OutputsGate()
    assert gate.compare([{"p": tiny}], [{"p": other}]) == ("", "cosine 1.000000, error/range 0")
    # the old gate's verdict on the same arrays: cosine noise
    assert compare_arrays("p", tiny, other, 0.9999, 1e-3)[0].startswith("output 'p': cosine")
    # far values: float32's step at 1000 is 6e-5; rounding there is not a fault either
    big = np.full(100, 1000.0, np.float32) + np.linspace(0, 1e-3, 100, dtype=np.float32)
    assert gate.compare([{"y": big}], [{"y": big + np.float32(2e-4)}])[0] == ""
    # but a real difference near zero is refused
    why, _ = gate.compare([{"p": tiny}], [{"p": tiny + np.float32(1e-4)}])
    assert why.startswith("output 'p'")
    # the floor does not widen with calibration on noise: it is the same gate
    assert gate.calibrate([{"p": tiny}], [{"p": other}]) == gate


def test_load_model_judges_an_image_model_on_photos_at_the_size_it_runs(
        tmp_path: Path, ppocr_det_path: Path, photos: None) -> None:
    """load_model's own gate runs the sample photographs (a word drawn on each) through the
    example model's normalization at the input size; every fp32 onnxruntime configuration
    agrees with the reference there."""
    with edgeinfer.load_model(ppocr_det_path, input_shapes=TEXT_LINE, providers="cpu",
                              threads=1, state_dir=tmp_path / "s", probe_budget_s=6) as m:
        sel = m.selection
    assert sel is not None
    assert sel["inputs"].startswith("4 sample photos with a word (RGB, (x/255 - "), sel["inputs"]
    assert "at x 1x3x64x480 (size from input_shapes)" in sel["inputs"]
    fp32 = [r for r in sel["candidates"] if r["choice"]["precision"] == "fp32"]
    assert len(fp32) >= 2
    assert all(r["status"] in ("ok", "picked") for r in fp32), fp32


def _dynamic_conv(path: Path, metadata: dict[str, str] | None = None) -> Path:
    """A convolution over ``images [batch, 3, height, width]`` as Ultralytics exports with
    ``dynamic=True`` (its size only in the metadata's ``imgsz``)."""
    w = np.random.default_rng(0).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["images", "w"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Sigmoid", ["c"], ["output0"])], "dyn",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                       ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                                       ["batch", 4, "h2", "w2"])],
        [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    if metadata:
        helper.set_model_props(model, metadata)
    onnx.save(model, path)
    return path


def test_a_dynamic_size_is_never_guessed_it_is_refused_naming_input_shapes(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _dynamic_conv(tmp_path / "dyn.onnx")
    with caplog.at_level(logging.WARNING, logger="edgeinfer"), \
            edgeinfer.load_model(path, threads=1, state_dir=tmp_path / "s") as m:
        sel = m.selection
        assert sel is not None
        measured = [r for r in sel["candidates"] if r["p50_ms"] is not None]
        assert not measured  # nothing timed or judged at 1x3x1x1
        assert "not measured: the size of images ?x3x?x? is not known" in sel["summary"]
        assert "input_shapes={'images': [1, 3, N, N]}" in sel["summary"]
        assert "--input-shape images=1x3xNxN" in sel["summary"]
    assert any("not measured" in r.getMessage() for r in caplog.records)
    # given the size, it is measured there, and says so
    with edgeinfer.load_model(path, threads=1, state_dir=tmp_path / "s",
                              input_shapes={"images": [1, 3, 64, 96]}) as m:
        sel = m.selection
        assert sel is not None and "images 1x3x64x96 (size from input_shapes)" in sel["inputs"]
        assert any(r["p50_ms"] is not None for r in sel["candidates"])


def test_an_ultralytics_imgsz_in_the_metadata_sizes_the_measurement(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgeinfer.cli import main

    path = _dynamic_conv(tmp_path / "yolo.onnx", {"imgsz": "[96, 160]", "stride": "32"})
    with edgeinfer.load_model(path, threads=1, state_dir=tmp_path / "s") as m:
        sel = m.selection
        assert sel is not None
        assert "at images 1x3x96x160 (size from the model's metadata (imgsz))" in sel["inputs"]
        assert m.info()["input_shapes"] == {"images": [1, 3, 96, 160]}
    rc = main(["info", str(path), "--threads", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("images"))
    assert "1x3x96x160" in line and "size from the model's metadata (imgsz)" in line, out


def test_a_pick_that_is_not_the_fastest_row_says_why() -> None:
    """``info`` showed openvino 1t 47.30 ms picked over onnxruntime 2t 46.93 ms, no word why."""
    ov = Row(Choice("openvino", "CPU", "fp32", 1), "picked", 47.30, final=True)
    ort = Row(Choice("onnxruntime", CPU, "fp32", 2, "all", False), "ok", 46.93, final=True)
    why = pick_reason([ov, ort], ov)
    assert "onnxruntime CPU fp32 all 2t 46.93 ms was 0.8% faster" in why
    assert "within the 3% margin" in why and "fewer threads" in why
    slice_ = Row(Choice("onnxruntime", CPU, "fp32", 1, "all", False), "ok", 40.0, final=False)
    assert "not among the finalists" in pick_reason([ov, ort, slice_], ov)
    assert pick_reason([ov, ort], ort) == ""  # the fastest needs no word


def test_a_task_without_a_gate_of_its_own_judges_on_photos_through_its_preprocessing(
        tmp_path: Path, yolo_path: Path, photos: None) -> None:
    """``task: raw`` on an image model: its outputs gate ran on seeded random inputs."""
    from edgeinfer.config.pipeline import RawTask as RawConfig
    from edgeinfer.config.pipeline import VadTask as VadConfig
    from edgeinfer.tasks.raw import RawTask
    from edgeinfer.tasks.vad import VadTask

    with edgeinfer.load_model(yolo_path, probe=False, state_dir=tmp_path / "s") as m:
        gate = RawTask(RawConfig(), m).accuracy_gate()
        feeds = gate.sample_feeds(m.inputs)
        assert len(feeds) == 4 and feeds[0]["images"].shape == (1, 3, 320, 320)
        assert 0.0 <= feeds[0]["images"].min() < feeds[0]["images"].max() <= 1.0
    with edgeinfer.load_model("silero-vad", probe=False, state_dir=tmp_path / "s") as m:
        assert VadTask(VadConfig(), m).accuracy_gate().sample_feeds(m.inputs) == []


def test_the_selection_of_a_pick_within_the_margin_says_why_it_won(tmp_path: Path) -> None:
    from edgeinfer.runtime.decision import Decision
    from edgeinfer.testing import onnx_models as om

    ov = Row(Choice("openvino", "CPU", "fp32", 1), "picked", 47.30, final=True)
    ort = Row(Choice("onnxruntime", CPU, "fp32", 2, "all", False), "ok", 46.93, final=True)
    decision = Decision(ov.choice, [ort, ov], "outputs", "4 sample photos")
    with edgeinfer.load_model(om.matmul_model(tmp_path / "mm.onnx"), probe=False,
                              state_dir=tmp_path / "s") as m:
        select.annotate_decision(m._session, decision)
        why = m.selection["why_picked"] if m.selection else ""
    assert why.startswith("not the fastest row: onnxruntime CPU fp32 all 2t 46.93 ms"), why
