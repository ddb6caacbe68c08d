"""Scene annotation: boxes, the highlighted track, zones, lines with their ``in`` arrow, scale."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.analytics.draw import (
    BOX_COLOR,
    HIGHLIGHT_COLOR,
    LINE_COLOR,
    ZONE_COLOR,
    TrackBox,
    decode_jpeg,
    draw_scene,
    encode_jpeg,
)
from edgeinfer.errors import InvalidInputError


def _is(pixel: np.ndarray, color: tuple[int, int, int]) -> bool:
    return bool(np.all(np.abs(pixel.astype(int) - color) < 40))


def _count(image: np.ndarray, color: tuple[int, int, int]) -> int:
    return int(np.all(np.abs(image.astype(int) - color) < 40, axis=2).sum())


def test_boxes_highlight_and_scale() -> None:
    image = np.zeros((480, 640, 3), np.uint8)
    boxes = [TrackBox(1, "person", 0.9, (100, 100, 200, 300)),
             TrackBox(2, "car", 0.8, (300, 100, 500, 300)),
             TrackBox(None, "dog", 0.4, (50, 350, 150, 450))]
    draw_scene(image, boxes, highlight=2)
    assert _is(image[200, 100], BOX_COLOR)        # left edge of track 1
    assert _is(image[200, 300], HIGHLIGHT_COLOR)  # left edge of the highlighted track
    assert _is(image[400, 50], BOX_COLOR)         # untracked detection
    thin = _count(image[200:201, 95:110], BOX_COLOR)
    thick = _count(image[200:201, 295:310], HIGHLIGHT_COLOR)
    assert thick > thin  # the highlighted track stands out
    assert _count(image[60:100, 100:200], BOX_COLOR) > 0  # "person #1 0.90" above the box

    half = np.zeros((240, 320, 3), np.uint8)
    draw_scene(half, boxes[:1], scale=0.5)
    assert _is(half[100, 50], BOX_COLOR)
    assert not _is(half[200, 100], BOX_COLOR)


def test_zone_is_outlined_tinted_and_named() -> None:
    image = np.zeros((200, 300, 3), np.uint8)
    zone = np.array([[50, 50], [250, 50], [250, 150], [50, 150]])
    draw_scene(image, [], [("door", "zone", zone)])
    assert _is(image[50, 150], ZONE_COLOR)
    inside, outside = image[100, 150], image[180, 150]
    assert inside.sum() > 0 and outside.sum() == 0  # translucent fill only inside
    assert inside[1] > inside[0] and inside[2] > inside[0]  # tinted towards the zone colour
    assert _count(image[20:50, 50:150], ZONE_COLOR) > 10  # its name


@pytest.mark.parametrize(("points", "below"), [([[40, 100], [260, 100]], True),
                                               ([[260, 100], [40, 100]], False)])
def test_line_arrow_points_to_the_in_side(points: list[list[int]], below: bool) -> None:
    # LineConfig: drawn left to right, moving down the image is "in"; swapped points swap it.
    image = np.zeros((200, 300, 3), np.uint8)
    draw_scene(image, [], [("gate", "line", np.array(points))])
    assert _is(image[100, 150], LINE_COLOR)
    under = _count(image[105:140, 140:160], LINE_COLOR)
    over = _count(image[60:95, 140:160], LINE_COLOR)
    assert (under > 5 and over == 0) if below else (over > 5 and under == 0)


def test_jpeg_roundtrip_and_bad_input() -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, 32:] = (0, 0, 255)
    data = encode_jpeg(image, 90)
    assert data[:2] == b"\xff\xd8"
    back = decode_jpeg(data)
    assert back.shape == image.shape and _is(back[24, 48], (0, 0, 255))
    with pytest.raises(InvalidInputError):
        encode_jpeg(np.zeros((4, 4, 7), np.float64), 90)
    with pytest.raises(InvalidInputError):
        decode_jpeg(b"not a jpeg")


def test_an_event_frame_carries_its_keypoints_and_mask_outlines() -> None:
    """Pose keypoints (those scoring 0.5 or more) and segment outlines of an event's boxes are
    drawn in its snapshot and clip as in the live view; plain boxes carry none."""
    from edgeinfer.analytics.draw import POINT_COLOR, boxes_shapes, draw_shapes
    from edgeinfer.frames import Detection

    pose = Detection("person", 0, 0.9, (20.0, 20.0, 120.0, 180.0), track_id=3,
                     keypoints=((60.0, 40.0, 0.9), (90.0, 150.0, 0.2)))
    seg = Detection("cup", 1, 0.8, (140.0, 40.0, 200.0, 100.0),
                    mask=((150.0, 50.0), (190.0, 50.0), (190.0, 90.0), (150.0, 90.0)), area=1600.0)
    plain = TrackBox(None, "box", 0.5, (10.0, 10.0, 30.0, 30.0))
    shapes = boxes_shapes([pose, seg, plain])
    assert shapes == (("points", ((60.0, 40.0),)), ("outline", seg.mask))
    image = np.zeros((200, 220, 3), np.uint8)
    draw_shapes(image, shapes, scale=1.0)
    assert _is(image[40, 60], POINT_COLOR) and not _is(image[150, 90], POINT_COLOR)
    assert _is(image[50, 170], POINT_COLOR) and not _is(image[70, 170], POINT_COLOR)
