"""The pipeline the web tests run: BlazeFace on the looping scene video (a face crossing a line
and a zone), with event snapshots and clips, as a config dict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeinfer.testing.scene_video import SceneTruth


def scene_pipeline(name: str, truth: SceneTruth, model: Path, folder: Path,
                   clip_format: str = "mjpeg") -> dict[str, Any]:
    """One entry of ``pipelines:``; results go to ``folder/results.jsonl``."""
    return {
        "name": name,
        "source": {"type": "video", "uri": str(truth.path), "fps": truth.fps, "loop": True},
        "model": {"path": str(model), "threads": 1, "probe": False},
        "task": {"type": "detect", "decoder": "blazeface", "score_threshold": 0.6},
        **truth.scene_config(),
        "record": {"snapshots": True, "events": ["enter", "exit", "cross"],
                   "clips": {"pre_s": 0.5, "post_s": 0.5, "fps": 7.5, "format": clip_format}},
        "sinks": [{"type": "jsonl", "path": str(folder / "results.jsonl")}],
    }
