"""A pipeline serves at once and switches to the measured backend between two frames.

Real pipelines from configs (video source, real models); the decision is measured in the
background with the task's gate and the swap happens while frames flow.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from edgeinfer.config import parse_config
from edgeinfer.pipeline import Pipeline
from edgeinfer.model.samples import demo_video
from edgeinfer.model.pool import SharedModel, model_pool
from edgeinfer.testing import onnx_models as om


def _classify(name: str, model: Path, video: Path) -> dict[str, Any]:
    return {"name": name, "source": {"type": "video", "uri": str(video)},
            "model": {"path": str(model), "threads": 2},
            "task": {"type": "classify", "top_k": 3, "preprocess": {"size": [32, 32]}},
            "sinks": []}


def test_pipelines_sharing_a_model_all_switch_to_the_measured_winner(tmp_path: Path,
                                                                      monkeypatch: Any) -> None:
    monkeypatch.setenv("EDGEINFER_STATE_DIR", str(tmp_path / "state"))  # measure afresh
    tiny = om.tiny_classifier(tmp_path / "tiny.onnx")
    video = demo_video(tmp_path / "v.mp4", frames=120)
    config = parse_config(json.dumps({"pipelines": [_classify(f"cam{i}", tiny, video)
                                                    for i in range(2)]}))
    results: dict[str, list[Any]] = {"cam0": [], "cam1": []}
    held = len(model_pool())  # another test's session fixture may hold one in this worker
    pipes = [Pipeline.from_config(config, name=n, on_result=results[n].append)
             for n in ("cam0", "cam1")]
    try:
        assert all(isinstance(p.model, SharedModel) for p in pipes)
        pooled = pipes[0].model.shared  # type: ignore[attr-defined]
        for p in pipes:
            p.start()
        deadline = time.monotonic() + 60
        while (pooled.selecting or pooled.selection is None) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in pipes:
            assert p.join(120) and p.error is None, p.error
        decision = pooled.selection
        assert decision is not None and decision["gate"] == "classify"
        for p in pipes:  # every sharer runs the one session the model swapped in
            assert p.model.report.choice == pooled.report.choice
            snap = p.snapshot()
            assert snap["backend"]["choice"] == decision["picked"]
            assert snap["backend"]["selecting"] is False
        assert len(results["cam0"]) == len(results["cam1"]) == 120
        assert not pooled._retired  # the swapped-out session was closed
        # results name the backend that computed them
        assert results["cam0"][-1].provider == pooled.provider
    finally:
        for p in pipes:
            p.close()
    assert len(model_pool()) == held  # both sharers gone: the model left the pool
    # the next start opens the decision cached under the task's gate at once
    pipe = Pipeline.from_config(config, name="cam0")
    try:
        assert pipe.model.selection is not None and pipe.model.selection["cached"] is True
        assert not pipe.model.selecting
    finally:
        pipe.close()
