"""The shared-memory frame ring between a capture process and its pipeline
(``sources/framering.py``), both sides in one process over one memfd."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import numpy as np
import pytest

from edgeinfer.sources.framering import LOW_FREE, MAX_REGIONS, RingReader, RingWriter

SHAPE = (48, 64, 3)
FRAME_BYTES = 48 * 64 * 3


@pytest.fixture
def ring() -> Iterator[tuple[RingWriter, RingReader]]:
    fd = os.memfd_create("edgeinfer-test-ring")
    writer = RingWriter(fd, ring_bytes=8 * 12288)  # 8 slots of 3 pages
    reader = RingReader(fd)
    try:
        yield writer, reader
    finally:
        writer.close()
        reader.close()
        os.close(fd)


def _put(writer: RingWriter, reader: RingReader, value: int) -> tuple[int, np.ndarray] | None:
    placed = writer.put(np.full(SHAPE, value, np.uint8))
    if placed is None:
        return None
    slot, fresh = placed
    if fresh:
        assert writer.layout is not None
        reader.adopt(writer.layout)
    return slot, reader.frame(slot, SHAPE)


def test_a_reader_that_keeps_up_uses_one_slot_and_touches_no_other(
        ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    for value in range(50):
        placed = _put(writer, reader, value)
        assert placed is not None
        slot, frame = placed
        assert slot == 0 and int(frame[0, 0, 0]) == value and frame.shape == SHAPE
        del frame, placed
        gc.collect()
    layout = writer.layout
    assert layout is not None and layout.slots == 8
    # the pages of the slots never used were never written: the file reads zeros there
    data = os.pread(writer._fd, layout.end - layout.slot_offset(1), layout.slot_offset(1))
    assert data.count(0) == len(data)


def test_a_held_frame_is_never_written_over_and_its_slot_comes_back_when_it_goes(
        ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    first = _put(writer, reader, 1)
    second = _put(writer, reader, 2)
    assert first is not None and second is not None
    assert (first[0], second[0]) == (0, 1)
    third = _put(writer, reader, 3)
    assert third is not None and third[0] == 2
    assert int(first[1][0, 0, 0]) == 1 and int(second[1][0, 0, 0]) == 2  # intact
    del first, third
    gc.collect()
    fourth = _put(writer, reader, 4)
    assert fourth is not None and fourth[0] == 0  # the lowest slot freed: reused
    assert int(second[1][5, 5, 2]) == 2


def test_a_reader_holding_frames_gets_copies_when_the_ring_runs_low_and_never_starves_it(
        ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    held = []
    for value in range(40):  # held for ever: a consumer that keeps every frame
        placed = _put(writer, reader, value)
        assert placed is not None, f"frame {value} dropped though the reader copies out"
        held.append(placed[1])
    assert reader.copied == 40 - (8 - LOW_FREE)  # the rest kept in place
    assert [int(f[0, 0, 0]) for f in held] == list(range(40))


def test_with_no_free_slot_the_writer_drops_the_frame(
        ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    slots = []
    for value in range(8):  # taken by the writer, never wrapped by a reader: nothing frees
        placed = writer.put(np.full(SHAPE, value, np.uint8))
        assert placed is not None
        slots.append(placed[0])
    assert slots == list(range(8))
    assert writer.put(np.zeros(SHAPE, np.uint8)) is None
    assert writer.put(np.zeros(SHAPE, np.uint8), reserve=LOW_FREE) is None


def test_a_new_frame_size_starts_a_region_after_the_frames_still_held(
        ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    old = _put(writer, reader, 7)
    assert old is not None
    first = writer.layout
    big = np.full((96, 128, 3), 9, np.uint8)
    placed = writer.put(big)
    assert placed is not None and placed[1]  # a new layout
    assert writer.layout is not None and first is not None
    assert writer.layout.offset >= first.end  # after the region still in use
    reader.adopt(writer.layout)
    frame = reader.frame(placed[0], big.shape)
    assert int(frame[95, 127, 2]) == 9 and int(old[1][0, 0, 0]) == 7
    # regions still held are bounded: a camera flipping sizes while frames are kept
    kept = [old[1], frame]
    for i in range(MAX_REGIONS + 2):
        shape = (48 + 8 * (i + 1), 64, 3)
        placed = writer.put(np.full(shape, i, np.uint8))
        if placed is None:
            break
        assert writer.layout is not None
        reader.adopt(writer.layout)
        kept.append(reader.frame(placed[0], shape))
    else:
        pytest.fail("regions grew without bound while frames were held")
    assert len(kept) == MAX_REGIONS


def test_a_slot_number_outside_the_ring_is_refused(ring: tuple[RingWriter, RingReader]) -> None:
    writer, reader = ring
    assert _put(writer, reader, 1) is not None
    with pytest.raises(ValueError, match="not in the ring"):
        reader.frame(8, SHAPE)
