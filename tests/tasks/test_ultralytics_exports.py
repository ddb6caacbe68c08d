"""Real Ultralytics exports (made by ``scripts/check-ultralytics-exports`` in a side venv, never a
dependency here) decoded by edgeinfer: box for box what Ultralytics' own ``predict`` found, with
the same labels, scores, keypoints and mask areas (``edgeinfer.testing.ultralytics_exports``).
Skipped unless ``EDGEINFER_ULTRALYTICS_EXPORTS`` names the folder the script wrote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgeinfer.testing.ultralytics_exports import Case, compare, edgeinfer_detections, load_cases

FOLDER = os.environ.get("EDGEINFER_ULTRALYTICS_EXPORTS")
CASES = load_cases(Path(FOLDER)) if FOLDER else []

pytestmark = pytest.mark.skipif(
    not FOLDER, reason="set EDGEINFER_ULTRALYTICS_EXPORTS to the folder "
                       "scripts/check-ultralytics-exports wrote")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_export_decodes_as_ultralytics_predict(case: Case) -> None:
    result = compare(case, edgeinfer_detections(case))
    assert result.problems == [], result.line()
    assert result.matched == len(case.expected) - result.borderline
