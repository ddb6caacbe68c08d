"""The ``blazepose`` decoder on MediaPipe's real person detector, and the catalog's renamed
example detector."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import edgeinfer
from edgeinfer.config.pipeline import DetectTask as DetectConfig
from edgeinfer.frames import Frame
from edgeinfer.model import catalog, samples
from edgeinfer.tasks.detect import DetectTask


def _detect(path: Path, **options: object) -> tuple[DetectTask, list[dict[str, object]]]:
    model = edgeinfer.load_model(path, probe=False)
    task = DetectTask(DetectConfig(**options), model)  # type: ignore[arg-type]
    image = samples.load_image("astronaut")
    frame = Frame(0, 0.0, 0.0, image)
    feeds, context = task.preprocess(frame)
    found = task.postprocess(model.run(feeds), frame, context).detections or ()
    return task, [d.to_dict() for d in found]


def test_auto_picks_blazepose_and_a_person_box_holds_her_face(
        person_path: Path, blazeface_path: Path) -> None:
    task, people = _detect(person_path, score_threshold=0.5)
    assert task.decoder_choice[0] == "blazepose" and task.labels == ["person"]
    assert [p["label"] for p in people] == ["person"]
    _, faces = _detect(blazeface_path, score_threshold=0.5)
    assert len(faces) == 1
    (fx1, fy1, fx2, _), (px1, py1, px2, py2) = faces[0]["box"], people[0]["box"]
    # The whole-body square holds the face and reaches the picture's bottom (she is cut off
    # at the waist: her hips, the square's centre, are below the frame).
    assert px1 <= fx1 and py1 <= fy1 and px2 >= fx2 and py2 >= 500


def test_blazeface_is_not_picked_for_the_person_detector_nor_blazepose_for_faces(
        person_path: Path, blazeface_path: Path) -> None:
    from edgeinfer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"regressors 12 wide = 4 \+ 2 x 4 keypoints.*16"):
        _detect(person_path, decoder="blazeface")
    with pytest.raises(ConfigError, match=r"regressors 16 wide.*4 \+ 2 x 4 = 12"):
        _detect(blazeface_path, decoder="blazepose")
    assert _detect(blazeface_path)[0].decoder_choice[0] == "blazeface"


def test_the_old_example_name_works_with_a_warning(caplog: pytest.LogCaptureFixture,
                                                   yolo_path: Path) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeinfer.catalog"):
        entry = catalog.lookup("yolov8n-320")
        resolved = catalog.resolve_model("yolov8n-320")
    assert entry.name == "nudenet-320n" and resolved == yolo_path
    assert "now called 'nudenet-320n'" in caplog.text
