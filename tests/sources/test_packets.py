"""The packet ring under a hostile stream: one keyframe, then tiny P-frames for ever (issue 31
item 9). Packets are pushed straight into the ring, as the RTSP source pushes them."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from edgeinfer.sources.packets import PacketRing, StreamInfo

RATE = 1000  # P-frames a second, 13 bytes each: the stream
PRE_S = 1.0
GOP_S = 20.0  # the longest GOP the ring holds for a decodable start (docs/sources.md)
MAX_PACKETS = int((PRE_S + GOP_S) * 240)  # the default count bound for this pre-roll


@pytest.fixture
def ring() -> Iterator[PacketRing]:
    ring = PacketRing()
    ring.reset(StreamInfo("h264", 64, 48, (1, 90000)))
    ring.keep(PRE_S, 4 << 20)  # what the recorder asks for: pre_s, buffer_mb
    gc.disable()  # timings below are of the ring, not of a collection that lands in them
    yield ring
    gc.enable()


def _push(ring: PacketRing, i: int, keyframe: bool = False) -> None:
    ring.push(bytes(13), i * 90, i * 90, i / RATE, keyframe)


def test_one_keyframe_then_p_frames_keeps_the_ring_bounded_and_fast(ring: PacketRing) -> None:
    deadline = time.monotonic() + 5.0  # 30,000 pushes; the old ring rescanned itself: minutes
    _push(ring, 0, keyframe=True)
    most_packets, most_seconds = 0, 0.0
    for i in range(1, 30 * RATE):
        _push(ring, i)
        if i % 100 == 0:
            stats = ring.stats()
            most_packets = max(most_packets, int(stats["packets"] or 0))
            most_seconds = max(most_seconds, float(stats["seconds"] or 0.0))
            assert time.monotonic() < deadline, (
                f"{i} packets in 5 s: the ring cannot keep up with a {RATE} packet/s stream "
                f"(it holds {stats['packets']} packets, {stats['seconds']} s)")
    # Bounded by count (and time), not only by bytes: 30 s of 13-byte packets is 390 kB,
    # far under the 4 MiB budget the old ring trimmed by.
    assert most_packets <= MAX_PACKETS and most_seconds <= PRE_S + GOP_S
    stats = ring.stats()
    assert stats["overlong"] and stats["overlong"] >= 1  # said, not silent
    assert stats["packets"] == 0  # no keyframe since: nothing decodable is held
    # The camera goes back to GOPs of 1 s: the ring holds the pre-roll and one GOP again.
    start = 30 * RATE
    for i in range(start, start + 5 * RATE):
        _push(ring, i, keyframe=(i - start) % RATE == 0)
    stats = ring.stats()
    assert PRE_S <= float(stats["seconds"] or 0.0) < PRE_S + 1.0


def test_a_push_costs_the_same_whatever_the_ring_holds(ring: PacketRing) -> None:
    """The work per packet does not grow with the packets held (the old ring looked for the
    next keyframe from its front on every push: 10x the work at 10x the packets)."""
    def chunk_time(first: int) -> float:  # the fastest of 5 runs of 200 pushes
        best = float("inf")
        for run in range(5):
            begin = first + run * 200
            t0 = time.perf_counter()
            for i in range(begin, begin + 200):
                _push(ring, i)
            best = min(best, time.perf_counter() - t0)
        return best

    _push(ring, 0, keyframe=True)
    for i in range(1, 500):
        _push(ring, i)
    small = chunk_time(500)  # the ring holds 500-1,500 packets
    for i in range(1500, 4000):
        _push(ring, i)
    large = chunk_time(4000)  # 4,000-5,000 packets
    assert ring.stats()["packets"] >= 4000
    assert large < 3 * small, f"200 pushes: {small * 1e3:.2f} ms small, {large * 1e3:.2f} ms large"


def test_slices_of_one_picture_join_without_copying_the_picture_each_time(
        ring: PacketRing) -> None:
    """A stream whose every packet has the same pts joins them all into one picture: in place,
    not a new bytes object per slice (quadratic), and bounded by the byte budget."""
    deadline = time.monotonic() + 5.0
    ring.push(bytes(13), 0, 0, 0.0, True)
    for i in range(200_000):  # 2.6 MB of slices of one picture against a 4 MiB budget
        ring.push(bytes(13), 0, 0, 0.0, False)
        if i % 1000 == 0:
            assert time.monotonic() < deadline, f"{i} slices joined in 5 s"
    assert int(ring.stats()["bytes"] or 0) <= 2 * (4 << 20)
