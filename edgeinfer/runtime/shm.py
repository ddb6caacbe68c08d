"""The tensor region shared by ``worker.py`` (parent) and ``worker_child.py`` (the worker).

One ``memfd`` mapped on both sides; a call lays out its inputs, then its outputs, at 64-byte
aligned offsets. Either side may grow it; the other remaps when it sees the new size.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

MIB = 1 << 20

Meta = tuple[str, str, tuple[int, ...], int]
"""A tensor in the region: name, dtype string, shape, byte offset."""


def align(n: int) -> int:
    return (n + 63) & -64


def layout(arrays: Mapping[str, Any], start: int) -> tuple[list[Meta], dict[str, Any], int]:
    """Place each array after ``start``; those that cannot live in the region go inline."""
    metas: list[Meta] = []
    inline: dict[str, Any] = {}
    end = start
    for name, value in arrays.items():
        if not isinstance(value, np.ndarray) or value.dtype.hasobject:
            inline[name] = value  # strings, sequences, maps: pickled with the message
            continue
        off = align(end)
        metas.append((name, value.dtype.str, value.shape, off))
        end = off + value.nbytes
    return metas, inline, end


def view(mm: mmap.mmap | None, dtype: str, shape: tuple[int, ...], offset: int) -> np.ndarray:
    if 0 in shape:
        return np.empty(shape, dtype)
    return np.ndarray(shape, np.dtype(dtype), buffer=mm, offset=offset)


def copy_in(mm: mmap.mmap | None, metas: list[Meta], arrays: Mapping[str, np.ndarray]) -> None:
    for name, dtype, shape, off in metas:
        np.copyto(view(mm, dtype, shape, off), arrays[name])


def resize(fd: int, need: int) -> int:
    """Grow the memfd to at least ``need`` bytes (by half at least, whole MiB); return its size."""
    size = os.fstat(fd).st_size
    if size < need:
        size = -(-max(need, size + size // 2) // MIB) * MIB
        os.ftruncate(fd, size)
    return size


def unmap(mm: mmap.mmap | None) -> None:
    if mm is not None:
        try:
            mm.close()
        except BufferError:
            pass  # a view still holds it; it unmaps when the last view dies
