"""Model files whose metadata is hostile or wrong (issue 31, items 5-7): each is refused with a
typed error that names the value and the fix, fast and without parsing a bomb, and a keypoint
shape that does not fit the pose output is refused naming the numbers."""

from __future__ import annotations

import io
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.config.pipeline import PoseTask as PoseConfig
from edgeinfer.errors import ConfigError, ModelFormatError
from edgeinfer.tasks import make_task
from edgeinfer.tasks.decoders.meta import read_meta
from edgeinfer.tasks.labels import file_metadata, find_labels
from edgeinfer.testing.export_layouts import Planted, pose_model, ultralytics_metadata

SIZE = (320, 320)
POINTS = [np.tile(np.array([[100.0, 100.0, 0.9]], np.float32), (17, 1))]
PERSON = [Planted((80.0, 60.0, 200.0, 300.0), 0, 0.9)]


def _pose(path: Path, *, end2end: bool = False, names: bool = True, **meta: str) -> Path:
    md = ultralytics_metadata("pose", ["person"], SIZE, **meta)
    if not names:
        del md["names"]
    return pose_model(path, PERSON, POINTS, size=SIZE, end2end=end2end, metadata=md)


def _tflite(path: Path, files: dict[str, str]) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for member, text in files.items():
            z.writestr(member, text)
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(56) + buf.getvalue())
    return path


@pytest.mark.parametrize(("kpt", "end2end", "names", "words"), [
    ("[-17, -3]", False, True, "kpt_shape [-17, -3] is not K keypoints (K > 0)"),
    ("[1, 51]", False, True, "kpt_shape [1, 51] is not K keypoints (K > 0) of 2 or 3"),
    ("[51, 1]", True, True, "kpt_shape [51, 1] is not K keypoints (K > 0) of 2 or 3"),
    ("[17, 2]", False, True, "makes 17 x 2 = 34 values per box, but the output has 51 left "
                             "after the box and 1 class scores"),
    ("[16, 3]", True, True, "makes 16 x 3 = 48 values per box, but the output has 51 left"),
    ("[18, 3]", False, False, "makes 18 x 3 = 54 values per box, but the output has 51 left"),
    ("[17]", False, True, "kpt_shape '[17]' is not [keypoints, values per keypoint]"),
])
def test_a_kpt_shape_that_does_not_fit_the_pose_output_is_refused_naming_the_numbers(
        tmp_path: Path, kpt: str, end2end: bool, names: bool, words: str) -> None:
    """Old code: [-17, -3] and [1, 51] multiply to the 51 values and ran (every frame failing,
    or one 51-value keypoint); [51, 1] gave 51 meaningless points; [17, 2] was refused for its
    class count only; [17] was ignored."""
    path = _pose(tmp_path / "pose.onnx", end2end=end2end, names=names, kpt_shape=kpt)
    with edgeinfer.load_model(path) as m, pytest.raises(ConfigError) as err:
        make_task(PoseConfig(), m)
    assert words in str(err.value)


def test_a_2mb_kpt_shape_is_refused_unparsed_and_fast(tmp_path: Path) -> None:
    """Old code: literal_eval of a million zeros on every ``matches`` (18 per load: 98 s and
    1 GB at full size); the list was then ignored and the model ran."""
    bomb = "[" + "0, " * 700_000 + "0]"  # 2.1 MB
    path = _pose(tmp_path / "bomb.onnx", kpt_shape=bomb)
    with edgeinfer.load_model(path) as m:
        t0 = time.perf_counter()
        with pytest.raises(ModelFormatError) as err:
            make_task(PoseConfig(), m)
        took = time.perf_counter() - t0
    assert "metadata 'kpt_shape' is 2,100,003 characters long, over the 64 read" in str(err.value)
    assert "re-export the model" in str(err.value)
    assert took < 0.5, took


def test_names_that_are_not_a_table_are_a_typed_refusal(tmp_path: Path) -> None:
    """``{[1]: 'person'}`` made literal_eval raise TypeError, which took the daemon down."""
    md = ultralytics_metadata("detect", ["person"], SIZE)
    md["names"] = "{[1]: 'person'}"
    md["args"] = "{[1]: 2}"
    with pytest.raises(ConfigError, match="not a class-id -> name table"):
        read_meta(md)
    assert read_meta({"args": "{[1]: 2}"}).end2end is None  # args: only a hint, ignored


def test_a_packed_metadata_json_nested_200000_deep_is_refused(tmp_path: Path) -> None:
    """Old code: json.loads raised RecursionError (not a ValueError) out of the task."""
    deep = '{"names": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path = _tflite(tmp_path / "deep.tflite", {"metadata.json": deep})
    with pytest.raises(ModelFormatError, match="nested more than 32 deep"):
        file_metadata(path, "tflite", {})
    shallow = '{"names": ' + "[" * 40 + "]" * 40 + "}"  # under the recursion limit, over ours
    path = _tflite(tmp_path / "shallow.tflite", {"metadata.json": shallow})
    with pytest.raises(ModelFormatError, match="nested more than 32 deep"):
        file_metadata(path, "tflite", {})


@pytest.mark.parametrize("where", ["packed", "beside"])
def test_a_500000_line_labels_file_is_refused_fast(tmp_path: Path, where: str) -> None:
    """Under the 1 MiB cap, 500,000 one-character lines: old code took them all as labels
    (63 s and 1.15 GB at full size before a later check refused them)."""
    text = "a\n" * 500_000
    if where == "packed":
        path = _tflite(tmp_path / "m.tflite", {"labels.txt": text})
        fmt, error = "tflite", ModelFormatError
    else:
        path = tmp_path / "m.onnx"
        (tmp_path / "labels.txt").write_text(text)
        fmt, error = "onnx", ConfigError
    t0 = time.perf_counter()
    with pytest.raises(error, match="has 500,000 lines, over the 32,768 labels read"):
        find_labels(None, path, fmt, {})
    assert time.perf_counter() - t0 < 0.5


def test_metadata_is_parsed_once_per_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Every decoder's ``matches`` reads the metadata; it is parsed once (it was 18 times)."""
    import ast

    calls = []
    real = ast.literal_eval

    def counting(raw: str) -> object:
        calls.append(raw)
        return real(raw)

    monkeypatch.setattr(ast, "literal_eval", counting)
    md = ultralytics_metadata("pose", [f"person {time.time_ns()}"], SIZE, kpt_shape="[17,  3]")
    path = pose_model(tmp_path / "once.onnx", PERSON, POINTS, size=SIZE, metadata=md)
    with edgeinfer.load_model(path) as m:
        task = make_task(PoseConfig(), m)
        assert task.decoder.kpt_shape == (17, 3)  # type: ignore[attr-defined]
        with pytest.raises(ConfigError):
            make_task(DetectConfig(), m)  # every detect decoder's matches reads it again
    assert calls.count("[17,  3]") == 1 and calls.count(md["names"]) == 1, calls
