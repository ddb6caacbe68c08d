"""The shared-memory ring a capture process (``capture_child.py``) hands its frames through to
the pipeline (``isolated.py``): one ``memfd`` both map, fixed slots, no pickling.

A region of the file holds a page of slot states (one byte each: 0 free, 1 held by the
reader) and then its slots, each one frame's bytes rounded up to a page. The writer fills a
free slot, marks it held and sends the slot's number over the socket; the reader wraps the slot
in an array (no copy) whose last view, when garbage collected, marks it free again. So a frame
stays valid as long as anything (a queue, ``Pipeline.latest()``, a clip's pre-roll) holds it,
and the writer never writes over a frame in use: with no free slot it drops the new frame
(counted: ``full``). The writer takes the lowest free slot, so slots a reader that keeps up
never needs are never written: their pages cost no memory. The reader copies a frame out and
frees its slot at once when fewer than ``LOW_FREE`` slots would be left, so a consumer holding
many frames never starves the camera.

A new frame size (the camera changed its mode) starts a new region; while frames of the old one
are held the new region goes after it, so the file only grows by what is still in use, up to
``MAX_REGIONS`` regions' worth.
"""

from __future__ import annotations

import mmap
import os
import weakref
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_RING_BYTES", "LOW_FREE", "Layout", "RingReader", "RingWriter"]

PAGE = 4096
MIN_SLOTS = 4
MAX_SLOTS = 16
LOW_FREE = 2  # fewer free slots than this after taking one: the reader copies the frame out
MAX_REGIONS = 3
DEFAULT_RING_BYTES = 24 << 20  # 8 slots of 720p, the minimum 4 from 1080p up


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


@dataclass(frozen=True, slots=True)
class Layout:
    """One region of the ring: its state page at ``offset``, then ``slots`` slots of
    ``slot_bytes`` (one frame) each, page-aligned."""

    offset: int
    slots: int
    slot_bytes: int

    @property
    def stride(self) -> int:
        return _pages(self.slot_bytes)

    @property
    def end(self) -> int:
        return self.offset + PAGE + self.slots * self.stride

    def slot_offset(self, slot: int) -> int:
        return self.offset + PAGE + slot * self.stride


def plan(frame_bytes: int, ring_bytes: int, offset: int) -> Layout:
    """The region for frames of ``frame_bytes``: as many slots as ``ring_bytes`` holds, within
    ``MIN_SLOTS`` and ``MAX_SLOTS``."""
    slots = max(MIN_SLOTS, min(MAX_SLOTS, ring_bytes // _pages(frame_bytes)))
    return Layout(offset, slots, frame_bytes)


class RingWriter:
    """The capture process's side."""

    def __init__(self, fd: int, ring_bytes: int = DEFAULT_RING_BYTES) -> None:
        self._fd = fd
        self._ring_bytes = ring_bytes
        self._mm: mmap.mmap | None = None
        self._size = 0
        self.layout: Layout | None = None
        self._older: list[Layout] = []  # regions whose frames may still be held

    def put(self, data: np.ndarray, reserve: int = 1) -> tuple[int, bool] | None:
        """Copy ``data`` into a free slot and mark it held: ``(slot, new_layout)``, where
        ``new_layout`` says ``layout`` changed and the reader must be told before the slot;
        ``None``: fewer than ``reserve`` slots are free (the frame is dropped, or waits).

        A source that waits for its reader (a file) reserves ``LOW_FREE``: no more, or a reader
        that holds every frame (it copies out only below ``LOW_FREE``) would wait for ever."""
        nbytes = int(data.nbytes)
        layout, fresh = self.layout, False
        if layout is None or layout.slot_bytes != nbytes:
            layout = self._relayout(nbytes)
            if layout is None:
                return None
            fresh = True
        mm = self._mm
        assert mm is not None
        base = layout.offset
        if reserve > 1 and layout.slots - sum(mm[base:base + layout.slots]) < reserve:
            return None
        # The lowest free slot, not the next in turn: a reader that keeps up frees each frame
        # before the next, so the same one or two slots are used over and over. The others'
        # pages are never touched: they cost no memory (the daemon's PSS) and stay out of the
        # caches.
        slot = mm.find(b"\0", base, base + layout.slots) - base
        if slot < 0:
            return None
        dst = np.frombuffer(mm, np.uint8, count=nbytes, offset=layout.slot_offset(slot))
        np.copyto(dst.reshape(data.shape), data, casting="no")
        del dst
        mm[base + slot] = 1
        return slot, fresh

    def _held(self, layout: Layout) -> bool:
        mm = self._mm
        assert mm is not None
        return bool(any(mm[layout.offset:layout.offset + layout.slots]))

    def _relayout(self, nbytes: int) -> Layout | None:
        regions = [r for r in ([self.layout] if self.layout else []) + self._older
                   if self._held(r)]
        if len(regions) >= MAX_REGIONS:
            return None
        offset = max((r.end for r in regions), default=0)
        layout = plan(nbytes, self._ring_bytes, offset)
        if layout.end > self._size:
            self._grow(layout.end)
        mm = self._mm
        assert mm is not None
        mm[layout.offset:layout.offset + layout.slots] = bytes(layout.slots)
        self._older = regions
        self.layout = layout
        return layout

    def _grow(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        old, self._mm = self._mm, mmap.mmap(self._fd, size)
        self._size = size
        if old is not None:
            old.close()

    def close(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None


def _release(mm: mmap.mmap, index: int) -> None:
    try:
        mm[index] = 0
    except (ValueError, IndexError):  # the ring is closed: nothing to give back
        pass


class RingReader:
    """The pipeline's side: frames as arrays over the slots."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._mm: mmap.mmap | None = None
        self._size = 0
        self.layout: Layout | None = None
        self.copied = 0  # frames copied out because few slots were free

    def adopt(self, layout: Layout) -> None:
        """The writer's new region (mapped again if the file grew)."""
        if layout.end > self._size:
            size = os.fstat(self._fd).st_size
            # the old map stays alive as long as frames over it do (their arrays hold it)
            self._mm = mmap.mmap(self._fd, size)
            self._size = size
        self.layout = layout

    def frame(self, slot: int, shape: tuple[int, ...]) -> np.ndarray:
        """Slot ``slot`` of the current region as a uint8 array of ``shape``; freed when the
        last view of it goes, or copied out and freed now when the ring runs low."""
        layout, mm = self.layout, self._mm
        assert layout is not None and mm is not None
        if not 0 <= slot < layout.slots:
            raise ValueError(f"slot {slot} is not in the ring ({layout.slots} slots)")
        state = layout.offset + slot
        raw = np.frombuffer(mm, np.uint8, count=layout.slot_bytes,
                            offset=layout.slot_offset(slot))
        free = layout.slots - int(np.count_nonzero(
            np.frombuffer(mm, np.uint8, count=layout.slots, offset=layout.offset)))
        if free < LOW_FREE:
            out = raw.reshape(shape).copy()
            del raw
            mm[state] = 0
            self.copied += 1
            return out
        weakref.finalize(raw, _release, mm, state)
        return raw.reshape(shape)

    def close(self) -> None:
        """Drop this side's map; frames still held keep theirs until they go."""
        self._mm = None
