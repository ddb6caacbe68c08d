"""Typed config of scene analytics on a detect pipeline: ``track:``, ``zones:``, ``lines:`` and
``record:`` (event snapshots and clips). Field names are a contract (``docs/analytics.md``).

Geometry is checked here, where msgspec names the YAML path of a bad value: a zone needs at
least 3 distinct points and must not cross itself, a line needs two distinct points, normalized
coordinates lie in [0, 1]. Pixel coordinates are checked against the frame size when the
source fixes one (``check_frame_size``) and otherwise at the first frame; class names are
checked against the model's labels when the pipeline is assembled.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ._types import DAY, ConfigStruct, Fps, Fraction, MiB

__all__ = [
    "AnalyticsNameStr", "Anchor", "ClassFilter", "ClipConfig", "LineConfig", "RecordConfig",
    "RetentionConfig", "TrackConfig", "ZoneConfig", "polygon_problem",
]

_END = r"(?![\s\S])"
# A zone or line name is a topic-safe, discovery-safe word: letters, digits, _ and -.
AnalyticsNameStr = Annotated[str, Meta(pattern=rf"^[A-Za-z0-9_-]{{1,48}}{_END}")]
Coordinate = Annotated[float, Meta(ge=-1e6, le=1e6)]
Point = Annotated[list[Coordinate], Meta(min_length=2, max_length=2)]
Anchor = Literal["bottom_center", "center", "top_center"]
ClassFilter = list[str | Annotated[int, Meta(ge=0, le=100_000)]] | None
Frames = Annotated[int, Meta(ge=1, le=100_000)]
Secs = Annotated[float, Meta(ge=0, le=DAY)]


class TrackConfig(ConfigStruct, frozen=True):
    """ByteTrack-style multi-object tracking (``edgeinfer.analytics.tracker``).

    Attributes:
        high_threshold: Detections scoring at least this are matched first and may start tracks.
        low_threshold: Detections between this and ``high_threshold`` only continue existing
            tracks (the second association); below it they are ignored.
        new_track_threshold: A detection left unmatched starts a track only at this score.
        match_iou: Least IoU between a track's predicted box and a high-score detection, times
            the detection's score, to match (ByteTrack's ``1 - match_thresh``).
        low_match_iou: Least IoU for the second (low-score) association.
        min_hits: Frames a new track must be matched in before it is confirmed (gets a
            ``track_id`` in results and can make events); tracks born in a stream's first frame
            are confirmed at once.
        max_lost: Frames a track survives unmatched (its lifetime without detections) before it
            ends; an object hidden for up to this long keeps its id.
        per_class: Associate only detections of the track's own class.
    """

    high_threshold: Fraction = 0.5
    low_threshold: Fraction = 0.1
    new_track_threshold: Fraction = 0.6
    match_iou: Fraction = 0.2
    low_match_iou: Fraction = 0.5
    min_hits: Frames = 2
    max_lost: Frames = 30
    per_class: bool = True

    def __post_init__(self) -> None:
        if self.low_threshold > self.high_threshold:
            raise ValueError("low_threshold must not be above high_threshold")


class ZoneConfig(ConfigStruct, frozen=True):
    """A polygon zone: enter, exit, occupancy, dwell time and loitering of tracked objects.

    Attributes:
        name: Unique among the pipeline's zones and lines.
        points: The polygon's corners in order, at least 3, not crossing itself.
        coordinates: ``normalized`` (0..1 of the frame's width and height) or ``pixels``.
        classes: Count only these labels (or class ids); ``None``: every class.
        anchor: The point of a box that must lie in the zone.
        min_frames: Frames in a row an object must be inside (or outside) before it counts as
            entered (or left): a debounce against a box jittering on the edge.
        loiter_s: A ``loiter`` event when an object stays this long; ``None``: no loiter events.
    """

    name: AnalyticsNameStr
    points: Annotated[list[Point], Meta(min_length=3, max_length=256)]
    coordinates: Literal["normalized", "pixels"] = "normalized"
    classes: ClassFilter = None
    anchor: Anchor = "bottom_center"
    min_frames: Frames = 1
    loiter_s: Annotated[float, Meta(ge=0.1, le=DAY)] | None = None

    def __post_init__(self) -> None:
        _check_normalized(self.points, self.coordinates)
        problem = polygon_problem([(p[0], p[1]) for p in self.points])
        if problem:
            raise ValueError(problem)


class LineConfig(ConfigStruct, frozen=True):
    """A counting line: crossings by direction.

    ``in`` is a crossing from the left of the line to its right as drawn from its first point
    to its second, in image coordinates (y grows downwards): for a horizontal line drawn left
    to right, moving down the image is ``in``. Swap the points to swap the directions.

    Attributes:
        name: Unique among the pipeline's zones and lines.
        points: The line's two end points; the crossing must pass between them.
        coordinates: ``normalized`` or ``pixels``.
        classes: Count only these labels (or class ids); ``None``: every class.
        anchor: The point of a box whose path must cross the line.
        directions: The directions that make events (both are always counted).
    """

    name: AnalyticsNameStr
    points: Annotated[list[Point], Meta(min_length=2, max_length=2)]
    coordinates: Literal["normalized", "pixels"] = "normalized"
    classes: ClassFilter = None
    anchor: Anchor = "bottom_center"
    directions: Annotated[list[Literal["in", "out"]], Meta(min_length=1, max_length=2)] = (
        msgspec.field(default_factory=lambda: ["in", "out"]))

    def __post_init__(self) -> None:
        _check_normalized(self.points, self.coordinates)
        (x1, y1), (x2, y2) = self.points
        if abs(x2 - x1) < 1e-9 and abs(y2 - y1) < 1e-9:
            raise ValueError("a line needs two distinct points (this one has zero length)")


class ClipConfig(ConfigStruct, frozen=True):
    """Event clips cut from a ring buffer of already-encoded frames.

    Attributes:
        pre_s: Seconds before the event the clip starts (the ring buffer holds that much).
        post_s: Seconds after the event it ends.
        fps: Frames per second kept for clips and snapshots (each kept frame is JPEG-encoded
            once; frames in between are not stored).
        quality: JPEG quality of kept frames.
        max_width: Kept frames wider than this are scaled down first (``None``: full size); 960
            keeps VP8 clips affordable on a small board (the cost grows with the pixels).
        format: ``auto`` picks the first this OpenCV build writes and reads back: H.264 in
            MP4 (``h264``), VP8 in WebM (``vp8``), MPEG-4 Part 2 in MP4 (``mp4v``), MJPEG in
            AVI (``mjpeg``). Browsers play only the first two, hence the order; the PyPI OpenCV
            wheels lack an H.264 encoder, so ``auto`` is usually VP8, which costs five to seven
            times ``mp4v``'s time per frame (12 against 2 ms at 640x480, 24 against 4 ms at
            1280x720 on an x86 core; written on a low-priority thread). ``mp4v`` is the cheap
            choice for weak boards.
        buffer_mb: Most memory the ring buffer and the clips being cut may hold (and, with
            ``remux``, the camera's packets held for clips, the same again).
        remux: When the source keeps the camera's own packets (RTSP H.264/H.265 through PyAV,
            ``docs/sources.md``), cut clips from them: remuxed into MP4 from the keyframe at or
            before ``pre_s`` to ``post_s``, no decoding or encoding (no encoder CPU), the
            camera's resolution and frame rate, nothing drawn on them. ``false``, or a source
            without packets: the kept frames are encoded with boxes, zones and lines drawn.
    """

    pre_s: Annotated[float, Meta(ge=0, le=60)] = 3.0
    post_s: Annotated[float, Meta(ge=0, le=300)] = 5.0
    fps: Fps = 10.0
    quality: Annotated[int, Meta(ge=10, le=100)] = 75
    max_width: Annotated[int, Meta(ge=64, le=16384)] | None = 960
    format: Literal["auto", "h264", "vp8", "mp4v", "mjpeg"] = "auto"
    buffer_mb: MiB = 64.0
    remux: bool = True


class RetentionConfig(ConfigStruct, frozen=True):
    """How much event media is kept: the oldest files go first when a limit is passed.

    Attributes:
        max_mb: Most disk the pipeline's snapshots and clips take.
        max_age_h: Files older than this are deleted (``None``: no age limit).
        min_free_mb: Nothing is written while the disk has less free than this.
    """

    max_mb: MiB = 500.0
    max_age_h: Annotated[float, Meta(ge=0.01, le=24 * 3650)] | None = 168.0
    min_free_mb: MiB = 200.0


class RecordConfig(ConfigStruct, frozen=True):
    """Snapshots and clips of events, stored under ``<state>/media/<pipeline>/``.

    Attributes:
        snapshots: Write an annotated JPEG per event.
        snapshot: Which frame the snapshot shows: ``event``, the event's own frame (an
            ``exit``: the last kept frame in which the object was seen), or ``best``, the
            frame in which the track scored highest (it may show the object before it
            entered, or after it left).
        clips: Write a clip per event (``None``: no clips).
        events: The event types that get media.
        retention: Disk limits.
    """

    snapshots: bool = True
    snapshot: Literal["event", "best"] = "event"
    clips: ClipConfig | None = msgspec.field(default_factory=ClipConfig)
    events: list[Literal["enter", "exit", "cross", "loiter"]] = msgspec.field(
        default_factory=lambda: ["enter", "cross", "loiter"])
    retention: RetentionConfig = msgspec.field(default_factory=RetentionConfig)


def _check_normalized(points: list[list[float]], coordinates: str) -> None:
    for i, (x, y) in enumerate(points):
        if coordinates == "normalized" and not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
            raise ValueError(f"point {i} ({x:g}, {y:g}) is outside the frame: normalized "
                             "coordinates are between 0 and 1 (use `coordinates: pixels` for "
                             "pixel coordinates)")
        if coordinates == "pixels" and (x < 0 or y < 0):
            raise ValueError(f"point {i} ({x:g}, {y:g}) is outside the frame: pixel "
                             "coordinates are not negative")


def check_frame_size(points: list[list[float]], coordinates: str, width: int,
                     height: int) -> str | None:
    """Why pixel ``points`` do not fit a ``width`` x ``height`` frame, or ``None``."""
    if coordinates != "pixels":
        return None
    for i, (x, y) in enumerate(points):
        if x > width or y > height:
            return (f"point {i} ({x:g}, {y:g}) is outside the {width}x{height} frame")
    return None


def polygon_problem(points: list[tuple[float, float]]) -> str | None:
    """Why ``points`` is not a usable zone polygon (repeated points, no area, crossing edges),
    or ``None``."""
    n = len(points)
    distinct = {(round(x, 9), round(y, 9)) for x, y in points}
    if len(distinct) < 3:
        return "a zone needs at least 3 distinct points"
    for i in range(n):
        a, b = points[i], points[(i + 1) % n]
        if abs(a[0] - b[0]) < 1e-12 and abs(a[1] - b[1]) < 1e-12:
            return f"points {i} and {(i + 1) % n} are the same"
    for i in range(n):
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):
                continue  # adjacent edges share a corner
            if _segments_cross(points[i], points[(i + 1) % n], points[j], points[(j + 1) % n]):
                return (f"the zone crosses itself: edge {i}-{(i + 1) % n} meets edge "
                        f"{j}-{(j + 1) % n}")
    area2 = sum(points[i][0] * points[(i + 1) % n][1] - points[(i + 1) % n][0] * points[i][1]
                for i in range(n))
    if abs(area2) < 1e-12:
        return "the zone has no area (its points lie on one line)"
    return None


def _segments_cross(p1: tuple[float, float], p2: tuple[float, float], q1: tuple[float, float],
                    q2: tuple[float, float]) -> bool:
    def orient(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    def on(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> bool:
        return (min(a[0], b[0]) - 1e-12 <= c[0] <= max(a[0], b[0]) + 1e-12
                and min(a[1], b[1]) - 1e-12 <= c[1] <= max(a[1], b[1]) + 1e-12)

    d1, d2 = orient(q1, q2, p1), orient(q1, q2, p2)
    d3, d4 = orient(p1, p2, q1), orient(p1, p2, q2)
    if ((d1 > 0) != (d2 > 0) and d1 != 0 and d2 != 0
            and (d3 > 0) != (d4 > 0) and d3 != 0 and d4 != 0):
        return True
    return ((d1 == 0 and on(q1, q2, p1)) or (d2 == 0 and on(q1, q2, p2))
            or (d3 == 0 and on(p1, p2, q1)) or (d4 == 0 and on(p1, p2, q2)))
