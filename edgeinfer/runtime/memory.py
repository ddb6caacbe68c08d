"""Resident memory: measuring it, and the process-wide budget models are admitted against.

Measurements read ``/proc/self/status`` (Linux, what a device runs) and fall back to
``resource.getrusage`` (peak, not current) elsewhere.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import resource
import threading
from dataclasses import dataclass

from ..errors import ModelMemoryError

logger = logging.getLogger(__name__)

_STATUS = "/proc/self/status"


def _status_kb(field: str, pid: int | None = None) -> int | None:
    path = _STATUS if pid is None else f"/proc/{pid}/status"
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_mb(pid: int | None = None) -> float:
    """Current resident set size of this process (or ``pid``) in MiB."""
    kb = _status_kb("VmRSS", pid)
    if kb is None:
        # getrusage reports the peak in KiB on Linux; the best available elsewhere.
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return kb / 1024.0


@dataclass(frozen=True, slots=True)
class TreeMemory:
    """This process and its descendants (model workers, a measuring child, capture
    processes): proportional set size summed, so pages they share are counted once."""

    pss_mb: float
    processes: int
    estimated: int  # processes whose PSS could not be read (their RSS counted instead)

    def to_dict(self) -> dict[str, float | int]:
        return {"pss_mb": round(self.pss_mb, 1), "processes": self.processes,
                "estimated": self.estimated}


def tree_memory(pid: int | None = None, proc: str = "/proc") -> TreeMemory:
    """PSS of ``pid`` (default this process) and every process below it, from
    ``smaps_rollup``; a process whose PSS cannot be read (another user's, a kernel without
    ``smaps_rollup``) counts its RSS and is ``estimated``. Reads ``/proc`` once per call: for
    periodic stats, never per frame."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return TreeMemory(rss_mb(pid), 1, 1)
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        # the command may hold spaces and parentheses: the fields follow the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    total, count, estimated, todo = 0.0, 0, 0, [root]
    while todo and count < 4096:  # bounded: a fork bomb is not ours to count
        current = todo.pop()
        todo.extend(children.get(current, ()))
        kb = _pss_kb(current, proc)
        if kb is None:
            rss = _status_kb("VmRSS", current)
            if rss is None:
                continue  # exited meanwhile
            kb, estimated = rss, estimated + 1
        total += kb / 1024.0
        count += 1
    return TreeMemory(total, count, estimated)


def _pss_kb(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def peak_rss_mb(pid: int | None = None) -> float:
    """Peak resident set size (``VmHWM``) of this process (or ``pid``) in MiB."""
    kb = _status_kb("VmHWM", pid)
    if kb is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return kb / 1024.0


def vm_size_mb(pid: int | None = None) -> float:
    """Virtual address space in use (``VmSize``) in MiB; what ``RLIMIT_AS`` counts."""
    kb = _status_kb("VmSize", pid)
    return 0.0 if kb is None else kb / 1024.0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library this process already runs on (its global symbols): no ``find_library``,
    which runs ``ldconfig -p`` in a subprocess (13-20 ms, a fork in a threaded daemon)."""
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def _load_mallinfo2() -> object | None:
    libc = _libc()
    try:
        fn = libc.mallinfo2 if libc is not None else None
    except AttributeError:  # not glibc, or glibc < 2.33
        return None
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


_mallinfo2 = _load_mallinfo2()


def heap_in_use_mb() -> float | None:
    """Bytes the C heap has handed out and not taken back (all malloc arenas), in MiB.

    Unlike RSS this is not fooled by a new model reusing pages an earlier one freed.
    ``None`` where glibc's ``mallinfo2`` is unavailable.
    """
    if _mallinfo2 is None:
        return None
    info = _mallinfo2()  # type: ignore[operator]
    return float(info.uordblks + info.hblkhd) / (1024.0 * 1024.0)


class MemoryMeter:
    """What a piece of work added to this process's memory: the larger of the resident-set
    growth and the heap-in-use growth since the meter was made.

    RSS alone undercounts a model loaded after another was freed (its pages are reused); heap
    in use alone misses file mappings. Taking the larger is the honest lower bound of both.
    """

    __slots__ = ("_rss0", "_heap0")

    def __init__(self) -> None:
        self._rss0 = rss_mb()
        self._heap0 = heap_in_use_mb()

    def added_mb(self) -> float:
        rss = rss_mb() - self._rss0
        heap = heap_in_use_mb()
        if heap is None or self._heap0 is None:
            return rss
        return max(rss, heap - self._heap0)


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
FRAME_MMAP_THRESHOLD = 256 * 1024


def return_frames_to_the_os() -> bool:
    """Allocate blocks of 256 KiB and more (camera frames, their preprocessed tensors) with
    mmap, so each goes back to the OS when freed. glibc's default raises its mmap threshold to
    the largest block freed so far, after which frames come from the heap, and a heap that
    several threads' frames went through keeps their pages: about 6 MiB per camera measured
    with four pipelines on one shared model (1.27x -> 1.22x of one pipeline's resident memory
    at 5 fps per camera). The cost is a page fault per 4 KiB of a new frame (~0.1-0.2 ms per
    640x480 frame). For the daemon, set once at start; False where malloc is not glibc's."""
    libc = _libc()
    try:
        return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, FRAME_MMAP_THRESHOLD))
    except AttributeError:
        return False


def trim_heap() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``) after a model is dropped."""
    libc = _libc()
    try:
        if libc is not None:
            libc.malloc_trim(0)
    except AttributeError:
        pass


@dataclass(slots=True)
class _Charge:
    name: str
    mb: float


class MemoryBudget:
    """A process-wide memory budget that models are admitted against.

    ``load_model`` measures what a model really costs (resident memory after load and after the
    first run) and charges it here; a model that would go over is refused and nothing already
    admitted is disturbed. Thread-safe.
    """

    def __init__(self, limit_mb: float | None = None) -> None:
        self._lock = threading.Lock()
        self._limit_mb = limit_mb
        self._charges: dict[int, _Charge] = {}

    @property
    def limit_mb(self) -> float | None:
        return self._limit_mb

    def set_limit(self, limit_mb: float | None) -> None:
        """Set (or with ``None`` lift) the budget; models already admitted stay admitted."""
        with self._lock:
            self._limit_mb = limit_mb

    @property
    def used_mb(self) -> float:
        with self._lock:
            return sum(c.mb for c in self._charges.values())

    def available_mb(self) -> float | None:
        """What is left, or ``None`` when there is no budget."""
        with self._lock:
            if self._limit_mb is None:
                return None
            return self._limit_mb - sum(c.mb for c in self._charges.values())

    def check(self, name: str, mb: float) -> None:
        """Raise ``ModelMemoryError`` if charging ``mb`` more would break the budget."""
        with self._lock:
            self._check_locked(name, mb)

    def _check_locked(self, name: str, mb: float) -> None:
        if self._limit_mb is None:
            return
        used = sum(c.mb for c in self._charges.values())
        if used + mb > self._limit_mb:
            raise ModelMemoryError(
                f"model {name!r} needs {mb:.1f} MiB but the process budget "
                f"(memory_budget_mb={self._limit_mb:g}) has {self._limit_mb - used:.1f} MiB left "
                f"({used:.1f} MiB used by {len(self._charges)} loaded model(s))"
            )

    def charged_mb(self, key: int) -> float | None:
        """What ``key`` was admitted at, or ``None`` when it holds no charge."""
        with self._lock:
            charge = self._charges.get(key)
            return charge.mb if charge is not None else None

    def charge(self, key: int, name: str, mb: float) -> None:
        """Admit a model costing ``mb``; raises ``ModelMemoryError`` if it does not fit."""
        with self._lock:
            self._check_locked(name, mb)
            self._charges[key] = _Charge(name, mb)

    def release(self, key: int) -> None:
        with self._lock:
            self._charges.pop(key, None)


_BUDGET = MemoryBudget()


def process_budget() -> MemoryBudget:
    """The budget every ``load_model`` in this process charges."""
    return _BUDGET


def physical_cores() -> int:
    """Physical CPU cores (not SMT siblings) available to this process, at least 1."""
    try:
        allowed = frozenset(os.sched_getaffinity(0))
    except AttributeError:
        allowed = frozenset(range(os.cpu_count() or 1))
    return _cores_of(allowed)


@functools.lru_cache(maxsize=8)
def _cores_of(allowed: frozenset[int]) -> int:
    """The topology read once per set of allowed CPUs (the affinity may change, the CPUs not)."""
    cores: set[tuple[str, str]] = set()
    for cpu in allowed:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(base + "physical_package_id") as f:
                pkg = f.read().strip()
            with open(base + "core_id") as f:
                core = f.read().strip()
        except OSError:
            return max(1, len(allowed))
        cores.add((pkg, core))
    return max(1, len(cores))


def default_threads() -> int:
    """Intra-op threads for a small device: the physical cores, at most 4."""
    return min(4, physical_cores())


def set_memory_budget(limit_mb: float | None) -> None:
    """Set the process-wide ``memory_budget_mb`` every later ``load_model`` is admitted against.

    Set it before the first ONNX model is loaded with ``arena="bounded"``: the shared arena's cap
    is fixed when the arena is created.
    """
    if limit_mb is not None and limit_mb <= 0:
        raise ValueError(f"memory budget must be > 0 MiB, got {limit_mb!r}")
    _BUDGET.set_limit(limit_mb)
