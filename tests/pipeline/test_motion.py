"""The motion detector on synthetic frames: a still scene, a moving square, a masked flicker,
a global lighting change, and the cost against a detector's."""

from __future__ import annotations

import numpy as np
import pytest

from edgeinfer.config.motion import MotionConfig
from edgeinfer.pipeline.motion import MotionDetector, merge_boxes

W, H = 640, 480


def scene(seed: int = 0) -> np.ndarray:
    """A textured still background (smooth, so the blur does not wipe it out)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(40, 200, size=(H // 16, W // 16, 3), dtype=np.uint8)
    return np.kron(small, np.ones((16, 16, 1), dtype=np.uint8))


def noisy(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Sensor noise of a few grey levels."""
    noise = rng.integers(-4, 5, size=image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def test_a_still_scene_with_sensor_noise_has_no_motion() -> None:
    rng = np.random.default_rng(1)
    base = scene()
    motion = MotionDetector(MotionConfig())
    results = [motion.detect(noisy(base, rng)) for _ in range(30)]
    assert not any(r.moving for r in results)
    assert max(r.changed for r in results) < 0.001


def test_a_moving_square_gives_one_region_around_it() -> None:
    rng = np.random.default_rng(2)
    base = scene()
    motion = MotionDetector(MotionConfig())
    for _ in range(5):
        motion.detect(noisy(base, rng))
    for step in range(20):
        frame = noisy(base, rng)
        x, y = 100 + 12 * step, 200
        frame[y:y + 60, x:x + 60] = (250, 250, 250)
        result = motion.detect(frame)
        assert len(result.boxes) == 1, (step, result.boxes)
        x1, y1, x2, y2 = result.boxes[0]
        # The region holds the square and is not much bigger (dilation and blur add a rim).
        assert x1 <= x + 2 and y1 <= y + 2 and x2 >= x + 58 and y2 >= y + 58, result.boxes
        assert x2 - x1 < 60 + 80 and y2 - y1 < 60 + 60, result.boxes


def test_a_flicker_inside_a_mask_polygon_is_ignored_and_outside_it_is_not() -> None:
    base = scene()
    # The flicker: a lamp in the top left corner, switched on and off every other frame.
    masked = MotionDetector(MotionConfig(mask=[[[0.0, 0.0], [0.3, 0.0], [0.3, 0.25],
                                                [0.0, 0.25]]]))
    pixels = MotionDetector(MotionConfig(mask=[[[0, 0], [192, 0], [192, 120], [0, 120]]],
                                         coordinates="pixels"))
    bare = MotionDetector(MotionConfig())
    seen = {"masked": 0, "pixels": 0, "bare": 0}
    for i in range(20):
        frame = base.copy()
        if i % 2:
            frame[20:100, 20:160] = 255
        for name, detector in (("masked", masked), ("pixels", pixels), ("bare", bare)):
            seen[name] += detector.detect(frame).moving
    assert seen["masked"] == 0 and seen["pixels"] == 0
    assert seen["bare"] >= 9


def test_a_global_lighting_change_reseeds_the_background_and_stops_reporting() -> None:
    base = scene()
    motion = MotionDetector(MotionConfig())
    for _ in range(3):
        motion.detect(base)
    brighter = np.clip(base.astype(np.int16) + 60, 0, 255).astype(np.uint8)
    first = motion.detect(brighter)
    assert first.reseeded and not first.moving and first.changed > 0.5
    after = [motion.detect(brighter) for _ in range(10)]
    assert not any(r.moving for r in after)
    assert motion.reseeds == 1


def test_an_object_that_stops_is_no_motion_until_it_moves_again() -> None:
    base = scene()
    motion = MotionDetector(MotionConfig(alpha=0.05))
    motion.detect(base)
    frame = base.copy()
    frame[200:280, 300:380] = 255
    arrived = motion.detect(frame)
    assert arrived.moving
    still = [motion.detect(frame) for _ in range(15)]
    assert not any(r.moving for r in still)  # nothing changes from frame to frame
    # ... but the background has not learnt it at once (a quarter of alpha where it moved):
    assert still[-1].changed > 0.5 * arrived.changed
    left = motion.detect(base)  # it leaves: motion where it stood
    assert left.moving
    x1, y1, x2, y2 = left.boxes[0]
    assert x1 <= 300 and y1 <= 200 and x2 >= 380 and y2 >= 280, left.boxes


def test_the_ghost_of_an_object_in_the_first_frame_is_no_motion_once_it_left() -> None:
    base = scene()
    first = base.copy()
    first[100:160, 100:160] = 255  # in view when the background is seeded, then gone
    motion = MotionDetector(MotionConfig())
    motion.detect(first)
    assert motion.detect(base).moving  # it leaves
    assert not any(motion.detect(base).moving for _ in range(10))


def test_merge_boxes_joins_overlapping_and_near_boxes_only() -> None:
    boxes = np.array([[0, 0, 10, 10], [9, 9, 20, 20], [23, 0, 30, 5], [100, 100, 110, 110]],
                     dtype=np.float64)
    assert merge_boxes(boxes).tolist() == [[0, 0, 20, 20], [23, 0, 30, 5],
                                           [100, 100, 110, 110]]
    assert merge_boxes(boxes, gap=4).tolist() == [[0, 0, 30, 20], [100, 100, 110, 110]]


@pytest.mark.parametrize("size", [(1280, 720)])
def test_motion_costs_little_next_to_a_detector(size: tuple[int, int]) -> None:
    """Not a timing assert (ratios go to bench/): the detector only must not be absurd, well
    under the 10-20 ms a small detector takes on this class of machine."""
    import time

    w, h = size
    frame = np.kron(scene(), np.ones((2, 2, 1), dtype=np.uint8))[:h, :w]
    motion = MotionDetector(MotionConfig())
    motion.detect(frame)
    t0 = time.perf_counter()
    for _ in range(20):
        motion.detect(frame)
    per_frame_ms = (time.perf_counter() - t0) / 20 * 1000
    print(f"motion at {w}x{h}: {per_frame_ms:.2f} ms per frame")
    assert per_frame_ms < 50


def test_a_substream_frame_gives_regions_and_takes_pixel_masks_in_main_stream_pixels() -> None:
    """``Frame.display``: the image is a half-size copy of a 1280x960 main stream; the region
    and a mask in pixel coordinates are in the main stream's pixels (as zones and boxes are)."""
    rng = np.random.default_rng(3)
    base = scene()
    display = (2 * W, 2 * H)
    mask = [[[0, 0], [2 * 192, 0], [2 * 192, 2 * 120], [0, 2 * 120]]]  # main-stream pixels
    motion = MotionDetector(MotionConfig(mask=mask, coordinates="pixels"))
    for _ in range(5):
        motion.detect(noisy(base, rng), display)
    for step in range(8):
        frame = noisy(base, rng)
        x, y = 300 + 12 * step, 200
        frame[y:y + 60, x:x + 60] = (250, 250, 250)
        frame[0:100, 0:150] = 255 if step % 2 else 20  # a lamp inside the mask
        result = motion.detect(frame, display)
        if step == 0:
            continue
        assert len(result.boxes) == 1, (step, result.boxes)
        x1, y1, x2, y2 = result.boxes[0]
        assert x1 <= 2 * x + 4 and y1 <= 2 * y + 4, result.boxes
        assert x2 >= 2 * (x + 58) and y2 >= 2 * (y + 58), result.boxes
        assert x2 <= display[0] and y2 <= display[1]
