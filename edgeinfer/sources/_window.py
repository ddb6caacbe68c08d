"""Windowing shared by the sample and reading sources (audio, serial, mqtt), and the parsing of
one sensor reading (a CSV line or a JSON document).

A window is a fresh array handed to the pipeline read-only; the next window starts as a copy of
the overlap (``window - hop`` rows) and is filled in place, so each sample is converted once and
copied only into the later windows that overlap it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import numpy as np

from .. import _json

__all__ = ["ReadingParser", "SeriesWindows", "Windower"]


class Windower:
    """Cuts a stream of rows (samples, or readings of C values) into windows ``hop`` apart.

    Rows are written either in bulk into ``free()`` then ``commit(n)`` (audio: a pipe read goes
    straight into the window) or one by one with ``push(row)``. With ``hop > window`` the rows
    between windows are dropped: ``skip`` says how many are still to drop.

    Args:
        window: Rows per window.
        hop: Rows between window starts (``None``: ``window``).
        row_shape: Shape of one row (``()`` for samples, ``(C,)`` for readings).
        dtype: The windows' dtype.
    """

    __slots__ = ("_cur", "filled", "hop", "skip", "window")

    def __init__(self, window: int, hop: int | None = None, row_shape: tuple[int, ...] = (),
                 dtype: type | np.dtype = np.float32) -> None:
        self.window = window
        self.hop = hop or window
        self._cur = np.empty((window, *row_shape), dtype)
        self.filled = 0
        self.skip = 0

    @property
    def need(self) -> int:
        """Rows still missing to complete the current window (after ``skip``)."""
        return self.window - self.filled

    def free(self) -> np.ndarray:
        """The unfilled tail of the current window, to write rows into."""
        return self._cur[self.filled:]

    def commit(self, n: int) -> np.ndarray | None:
        """Count ``n`` rows written into ``free()``; returns the window if it is now complete."""
        self.filled += n
        if self.filled < self.window:
            return None
        out = self._cur
        out.flags.writeable = False  # later windows share nothing, but consumers must not write
        nxt = np.empty_like(out)
        keep = self.window - self.hop
        if keep > 0:
            nxt[:keep] = out[self.hop:]
        self._cur = nxt
        self.filled = max(keep, 0)
        self.skip = max(-keep, 0)
        return out

    def push(self, row: Sequence[float] | float) -> np.ndarray | None:
        """Add one row; returns the window it completes, if any."""
        if self.skip:
            self.skip -= 1
            return None
        self._cur[self.filled] = row
        return self.commit(1)

    def reset(self) -> None:
        """Drop the partial window (the stream was interrupted)."""
        self.filled = 0
        self.skip = 0


class SeriesWindows:
    """Windows of readings (``window x C`` float32) with the arrival time of each reading, so a
    window's ``start`` is when its first reading arrived."""

    __slots__ = ("_times", "_values")

    def __init__(self, window: int, hop: int | None, columns: int) -> None:
        self._values = Windower(window, hop, (columns,), np.float32)
        self._times = Windower(window, hop, (), np.float64)

    def push(self, values: Sequence[float], t: float) -> tuple[np.ndarray, float] | None:
        """Add a reading received at ``t``; returns ``(window, t of its first reading)`` when one
        is complete."""
        times = self._times.push(t)
        data = self._values.push(values)
        if data is None or times is None:
            return None
        return data, float(times[0])

    def reset(self) -> None:
        self._values.reset()
        self._times.reset()


class ReadingParser:
    """Parses one reading: a CSV line of numbers or a JSON document.

    JSON may be an object (the values of ``fields``, in order), an array of numbers or a single
    number. Without ``fields`` the columns are fixed by the first reading that parses (an
    object's keys, or ``c0, c1, ...``) and later readings must match it.

    Args:
        format: ``"csv"`` or ``"json"``.
        fields: Column names (CSV, arrays) or keys (objects), in order.
    """

    __slots__ = ("_csv", "fields")

    def __init__(self, format: str, fields: Sequence[str] = ()) -> None:
        self._csv = format == "csv"
        self.fields: tuple[str, ...] = tuple(fields)

    def parse(self, raw: bytes) -> list[float] | None:
        """The reading's values, or ``None`` if it does not parse or does not fit the fields."""
        parsed = self._parse_csv(raw) if self._csv else self._parse_json(raw)
        if parsed is None:
            return None
        values, names = parsed
        if not self.fields:
            self.fields = names or tuple(f"c{i}" for i in range(len(values)))
        elif len(values) != len(self.fields):
            return None
        return values

    def _parse_csv(self, raw: bytes) -> tuple[list[float], None] | None:
        try:
            values = [float(v) for v in raw.split(b",")]
        except ValueError:
            return None
        return (values, None) if all(math.isfinite(v) for v in values) else None

    def _parse_json(self, raw: bytes) -> tuple[list[float], tuple[str, ...] | None] | None:
        try:
            doc = _json.decode(raw)
        except msgspec.DecodeError:
            return None
        names = None
        if isinstance(doc, dict):
            names = self.fields or tuple(doc)
            try:
                doc = [doc[k] for k in names]
            except KeyError:
                return None
        elif not isinstance(doc, list):
            doc = [doc]
        if not doc or not all(_is_number(v) for v in doc):
            return None
        return [float(v) for v in doc], names


def _is_number(v: object) -> bool:
    # bool is an int subclass, but `true` is no sensor reading
    return (isinstance(v, int) and not isinstance(v, bool)) or (
        isinstance(v, float) and math.isfinite(v))
