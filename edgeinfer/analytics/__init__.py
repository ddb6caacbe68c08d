"""Scene analytics on detect pipelines: tracking, zones and lines, counters, events, media.

The pipeline's emit thread hands each frame's detections to `SceneAnalytics` (in
``edgeinfer.analytics.stage``), which gives them track ids (`tracker`), turns tracks into zone
and line events and counts (`scene`, `counters`), and keeps snapshots and clips of the events
(`recorder`). Nothing here but `draw` (which every pipeline's annotated snapshot uses) is
imported unless a pipeline configures ``track:``, ``zones:`` or ``lines:``.
"""
