"""``decoder: auto`` on a real Ultralytics export, labels from the model file (metadata, a label
file packed into a TFLite model), the built-in COCO lists, the metadata parser, and the
refusals that are not about one decoder's layout: ``resize: none`` on a dynamic input, COCO's 80
names on a model numbering COCO's 91 ids, a pipeline whose outputs turn out wrong."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeinfer
from edgeinfer.config import parse_config
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PreprocessConfig
from edgeinfer.errors import ConfigError, OutputLayoutError
from edgeinfer.model import Model
from edgeinfer.pipeline import Pipeline
from edgeinfer.runtime.base import TensorSpec
from edgeinfer.tasks.decoders import pick_decoder
from edgeinfer.tasks.decoders.meta import parse_names, read_meta
from edgeinfer.tasks.detect import DetectTask
from edgeinfer.tasks.labels import COCO80, COCO91, file_metadata, find_labels
from edgeinfer.testing.ultralytics_layouts import pose_model
from edgeinfer.testing.onnx_models import add_model


@pytest.fixture(scope="module")
def yolo(yolo_path: Path) -> Iterator[Model]:
    with edgeinfer.load_model(yolo_path, input_shapes={"images": (1, 3, 320, 320)}) as m:
        yield m


def test_real_ultralytics_export_picks_yolov8_and_its_own_names(yolo: Model) -> None:
    task = DetectTask(DetectConfig(), yolo)
    assert task.decoder_choice[0] == "yolov8"
    names = parse_names(yolo.metadata)
    assert names is not None and len(names) == 18
    assert task.labels == names and task.labels[0] == "FEMALE_GENITALIA_COVERED"
    assert task.decoder.num_classes == 18


def test_auto_says_when_nothing_comes_near_and_names_info_for_every_reason() -> None:
    """Every decoder's expectations in turn (about 2,500 characters) moved to `edgeinfer info
    MODEL --task detect`; the refusal says what to do (tests/tasks/test_decoder_lookalikes.py
    has the closest layouts leading)."""
    with pytest.raises(ConfigError, match=r"no decoder for the outputs y \[1, 4\]: none reads "
                                          r"outputs of these ranks.*Is it a detector\?.*"
                                          r"edgeinfer info m.onnx --task detect$") as caught:
        pick_decoder([TensorSpec("y", (1, 4), "float32")], {}, model="m.onnx")
    assert "decoder yolov8 expects" not in str(caught.value)


def ssd_model(path: Path, dynamic: bool = False) -> Path:
    """TFLite_Detection_PostProcess outputs: boxes (normalized ymin, xmin, ymax, xmax), classes
    numbered the TensorFlow way (person is 0 in the TFLite COCO SSD, 1 in TF's label map)."""
    outs = {"boxes": np.array([[[0.3, 0.2, 0.5, 0.6], [0, 0, 0, 0]]], np.float32),
            "classes": np.array([[17, 0]], np.float32),
            "scores": np.array([[0.9, 0]], np.float32), "count": np.array([1], np.float32)}
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("ReduceMax", ["images"], ["peak"], keepdims=0),
             helper.make_node("Mul", ["peak", "zero"], ["nothing"])]
    inits, infos = [zero], []
    for name, value in outs.items():
        inits.append(numpy_helper.from_array(value, name + "_v"))
        nodes.append(helper.make_node("Add", [name + "_v", "nothing"], [name]))
        infos.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)))
    dims: list[int | str] = [1, "h", "w", 3] if dynamic else [1, 300, 300, 3]
    graph = helper.make_graph(nodes, "ssd", [helper.make_tensor_value_info(
        "images", TensorProto.FLOAT, dims)], infos, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_resize_none_on_a_dynamic_input_is_refused(tmp_path: Path) -> None:
    """Issue 24: every box came out [0, 0, 0, 0] (the input size was taken as 0 x 0)."""
    with edgeinfer.load_model(ssd_model(tmp_path / "dyn.onnx", dynamic=True), probe=False) as m:
        with pytest.raises(ConfigError, match=r"resize: none.*dynamic size.*preprocess.size"):
            DetectTask(DetectConfig(decoder="ssd", preprocess=PreprocessConfig(resize="none")), m)


def test_coco80_names_on_a_tf_numbered_model_are_refused(tmp_path: Path) -> None:
    """Issue 24: an 80-line COCO file on a 91-id model named every class wrong."""
    coco_txt = tmp_path / "coco.txt"
    coco_txt.write_text("\n".join(COCO80))
    with edgeinfer.load_model(ssd_model(tmp_path / "ssd.onnx"), probe=False) as m:
        for labels in ("coco", str(coco_txt)):
            with pytest.raises(ConfigError, match=r"COCO's 80 names.*labels: coco91"):
                DetectTask(DetectConfig(decoder="ssd", labels=labels), m)
        task = DetectTask(DetectConfig(labels="coco91"), m)
        assert task.decoder_choice[0] == "ssd" and task.labels is not None
        assert task.labels[1] == "person" and task.labels[18] == "dog" and len(COCO91) == 91


def test_tflite_packed_metadata_and_label_file(tmp_path: Path) -> None:
    """Ultralytics packs metadata.json, Model Maker a labels file, into the zip appended to the
    flatbuffer."""
    def tflite(name: str, files: dict[str, str]) -> Path:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for member, text in files.items():
                z.writestr(member, text)
        path = tmp_path / name
        path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(56) + buf.getvalue())
        return path

    meta = {"author": "Ultralytics", "task": "detect", "imgsz": [320, 320],
            "names": {"0": "cat", "1": "dog"}}
    ul = tflite("ul.tflite", {"metadata.json": json.dumps(meta)})
    md = file_metadata(ul, "tflite", {})
    assert read_meta(md).imgsz == (320, 320) and read_meta(md).ultralytics
    assert find_labels(None, ul, "tflite", md) == (["cat", "dog"], "the model's metadata (names)")
    mm = tflite("mm.tflite", {"labelmap.txt": "person\nbicycle\n\n"})
    assert find_labels(None, mm, "tflite", file_metadata(mm, "tflite", {}))[0] == \
        ["person", "bicycle"]


@pytest.mark.parametrize(("raw", "names"), [
    ("{0: 'person', 1: 'car'}", ["person", "car"]),
    ('{"0": "person", "1": "car"}', ["person", "car"]),
    ("['person', 'car']", ["person", "car"]),
])
def test_metadata_names_parse_safely(raw: str, names: list[str]) -> None:
    assert parse_names({"names": raw}) == names


@pytest.mark.parametrize("raw", ["__import__('os').system('true')", "{0: 'a', 2: 'b'}", "3"])
def test_malformed_metadata_names_are_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="metadata 'names'.*give the task's labels"):
        parse_names({"names": raw})


def test_a_pipeline_whose_outputs_are_wrong_stops_with_the_layout(tmp_path: Path) -> None:
    """The check on the first frames ends the pipeline (its error names the likely layout),
    instead of costing one frame at a time while every result is wrong."""
    path = pose_model(tmp_path / "pose.onnx", size=(320, 320))
    config = parse_config(json.dumps({"pipelines": [{
        "name": "p", "source": {"type": "synthetic", "width": 320, "height": 240, "frames": 50},
        "model": {"path": str(path), "threads": 1},
        "task": {"type": "detect", "decoder": "yolov8", "labels": [f"c{i}" for i in range(52)]},
    }]}))
    pipeline = Pipeline.from_config(config)
    with pytest.raises(OutputLayoutError, match="likely a pose head"):
        list(pipeline)
    assert pipeline.health().state == "failed"


def test_a_classify_style_output_has_no_detect_decoder(tmp_path: Path) -> None:
    with edgeinfer.load_model(add_model(tmp_path / "a.onnx", (1, 3, 32, 32), "images"),
                              probe=False) as m:
        with pytest.raises(ConfigError, match="decoder: auto found no decoder"):
            DetectTask(DetectConfig(), m)
