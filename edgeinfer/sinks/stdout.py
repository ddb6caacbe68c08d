"""Results on standard output: one readable line each, or one JSON object per line."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from ..frames import Result
from .base import Sink


class StdoutSink(Sink):
    def __init__(self, config: Any, *, stream: TextIO | None = None, **_: Any) -> None:
        super().__init__(config)
        self._stream = stream

    def write(self, result: Result) -> None:
        stream = self._stream or sys.stdout
        if self.config.format == "json":
            stream.write(result.to_json().decode() + "\n")
        else:
            stream.write(format_line(result) + "\n")
            for event in result.events:
                stream.write(format_event(result.pipeline, event) + "\n")
        stream.flush()
        self.written += 1


def format_line(result: Result) -> str:
    """``faces #12 frame 36 3.1 ms  face 0.93 [101,52,188,160]`` and the like."""
    latency = sum(result.latency_ms)
    head = f"{result.pipeline} #{result.seq} frame {result.frame.index} {latency:.1f} ms "
    return head + " " + result.task.describe()


def format_event(pipeline: str, event: dict[str, Any]) -> str:
    """``faces event cross gate in  face #4 0.91 frame 120`` and the like (any dict: an event
    read off MQTT may hold anything)."""
    kind = str(event.get("type", "?"))
    where = event.get("zone") or event.get("line") or "?"
    parts = [f"{pipeline} event {kind} {where}"]
    if event.get("direction"):
        parts.append(str(event["direction"]))
    score = event.get("score")
    score_text = f" {score:.2f}" if isinstance(score, (int, float)) else ""
    parts.append(f" {event.get('label', '?')} #{event.get('track_id', '?')}{score_text}")
    dwell = event.get("dwell_s")
    if isinstance(dwell, (int, float)):
        parts.append(f"dwell {dwell:.1f} s")
    parts.append(f"frame {event.get('frame', '?')}")
    # A path only once the file is on disk; until then the snapshot is pending, or missing.
    if event.get("snapshot"):
        parts.append(f"snapshot {event['snapshot']}")
    elif event.get("snapshot_missing"):
        parts.append(f"no snapshot: {event['snapshot_missing']}")
    elif event.get("snapshot_pending"):
        parts.append("snapshot pending")
    return " ".join(parts)
