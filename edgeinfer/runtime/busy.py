"""How busy the box is with work that is not ours, and when a backend decision is re-checked.

The backend selector times candidates against each other; another process burning a core
while it does (a first boot beside other pipelines' decoders, a package upgrade) makes
multi-threaded candidates look slower than they are on a quiet box. So the selector reads the
load before and while it measures: the share of the CPUs this process may run on (its
affinity) that *other* processes used, from ``/proc/stat`` minus this process's own
``/proc/self/stat``, plus the hypervisor's steal. A decision measured over ``busy_share`` is
marked ``measured_under_load`` and is provisional: ``recheck.py`` measures its best
candidates again when the box has been idle for a while, or when live latency drifts from what
was measured (``RecheckSettings``).

Nothing here runs per frame: a reading is two small file reads, taken at most every few seconds.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError

__all__ = ["CpuTimes", "Load", "LoadMeter", "RecheckSettings", "load_between", "read_times"]


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative CPU time (clock ticks) of the CPUs this process may run on.

    Attributes:
        total: every state (idle and iowait included).
        busy: user, nice, system, irq, softirq (guest time is inside user).
        steal: time the hypervisor gave to other guests.
        own: this process's user + system time, all its threads.
        cpus: how many CPUs were summed.
    """

    total: int
    busy: int
    steal: int
    own: int
    cpus: int


@dataclass(frozen=True, slots=True)
class Load:
    """Other work's share of the CPUs over an interval.

    Attributes:
        others: share (0-1) of the CPUs' time that other processes used, steal included.
        steal: the hypervisor's share alone (0-1).
        cpus: the CPUs this process may run on.
    """

    others: float
    steal: float
    cpus: int

    def to_dict(self) -> dict[str, Any]:
        return {"others": round(self.others, 3), "steal": round(self.steal, 3), "cpus": self.cpus}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Load:
        return cls(float(d.get("others", 0.0)), float(d.get("steal", 0.0)), int(d.get("cpus", 1)))

    def describe(self) -> str:
        """``other processes used 48 % of 2 CPUs`` (steal named when there is any)."""
        steal = f", steal {self.steal * 100:.0f} %" if self.steal >= 0.005 else ""
        return f"other processes used {self.others * 100:.0f} % of {self.cpus} CPUs{steal}"


def read_times(stat: str = "/proc/stat", self_stat: str = "/proc/self/stat") -> CpuTimes | None:
    """The CPU times now, or None where ``/proc`` cannot tell (not Linux)."""
    try:
        allowed = os.sched_getaffinity(0)
        with open(stat, encoding="ascii") as f:
            lines = f.read().splitlines()
        with open(self_stat, encoding="ascii", errors="replace") as f:
            mine = f.read()
    except (OSError, AttributeError):
        return None
    total = busy = steal = cpus = 0
    for line in lines:
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *values = line.split()
        if int(name[3:]) not in allowed:
            continue
        v = [int(x) for x in values[:8]] + [0] * max(0, 8 - len(values))
        user, nice, system, idle, iowait, irq, softirq, st = v[:8]
        total += user + nice + system + idle + iowait + irq + softirq + st
        busy += user + nice + system + irq + softirq
        steal += st
        cpus += 1
    # fields after the command's closing parenthesis: utime and stime are the 12th and 13th
    after = mine.rpartition(")")[2].split()
    try:
        own = int(after[11]) + int(after[12])
    except (IndexError, ValueError):
        return None
    return CpuTimes(total, busy, steal, own, cpus) if cpus else None


def load_between(a: CpuTimes, b: CpuTimes) -> Load | None:
    """The load from reading ``a`` to reading ``b`` (None: no time passed between them)."""
    total = b.total - a.total
    if total <= 0:
        return None
    others = max(0, (b.busy - a.busy) - (b.own - a.own))
    steal = max(0, b.steal - a.steal)
    return Load(min(1.0, (others + steal) / total), min(1.0, steal / total), b.cpus)


class LoadMeter:
    """The load since the previous reading (or since it was made): ``read()``.

    ``reader`` is injectable (tests give fixed numbers)."""

    def __init__(self, reader: Callable[[], CpuTimes | None] = read_times) -> None:
        self._reader = reader
        self._last = reader()
        self._first = self._last

    def read(self) -> Load | None:
        """The load since the last ``read()``; None where it cannot be told."""
        now = self._reader()
        last, self._last = self._last, now
        if now is None or last is None:
            return None
        return load_between(last, now)

    def since_start(self) -> Load | None:
        """The load since the meter was made (not moving the last reading)."""
        now = self._reader()
        if now is None or self._first is None:
            return None
        return load_between(self._first, now)


@dataclass(frozen=True, slots=True)
class RecheckSettings:
    """When a backend decision counts as measured under load, and when it is checked again.

    Attributes:
        enabled: re-check decisions at all (measured under load, or drifting).
        busy_share: a measurement during which other processes used at least this share of
            the CPUs (0-1; one core burnt of 2 is 0.5) is ``measured_under_load``: provisional.
        idle_share: the box counts as idle while other processes use less than this share.
        idle_for_s: a provisional decision is re-checked after the box was idle this long.
        after_s: never re-check during a model's first seconds of serving (pipelines start,
            caches warm up).
        drift_ratio: live latency drifts when its median over the last readings exceeds this
            many times the decision's measured median...
        drift_for_s: ...for this long (any decision, provisional or not).
        budget_s: how long one re-check may measure (interleaved rounds of its few candidates).
        max_rechecks: re-checks per model per process, at most.
        min_interval_s: seconds between two re-checks of one model, at least.
        switch_gain: switch to a runner-up only when the serving choice's median is at least
            this many times the runner-up's (1.10: 10 % faster), with a stable ranking.
        poll_s: how often the load and the live latency are read (from the run path).
    """

    enabled: bool = True
    busy_share: float = 0.25
    idle_share: float = 0.10
    idle_for_s: float = 30.0
    after_s: float = 60.0
    drift_ratio: float = 1.5
    drift_for_s: float = 60.0
    budget_s: float = 6.0
    max_rechecks: int = 3
    min_interval_s: float = 300.0
    switch_gain: float = 1.10
    poll_s: float = 5.0

    @classmethod
    def of(cls, value: RecheckSettings | Mapping[str, Any] | bool | None,
           where: str = "recheck") -> RecheckSettings:
        """Settings from ``load_model(recheck=...)``: the struct, a mapping of its fields,
        ``True``/``None`` (the defaults) or ``False`` (off).

        Raises:
            ConfigError: an unknown field or a value out of range, named by ``where``.
        """
        if isinstance(value, RecheckSettings):
            settings = value
        elif value is None or value is True:
            settings = cls()
        elif value is False:
            settings = cls(enabled=False)
        elif isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}; "
                                  f"valid: {', '.join(sorted(known))}")
            settings = cls(**dict(value))
        else:
            raise ConfigError(f"{where}: expected true, false or a mapping of "
                              f"{', '.join(f.name for f in fields(cls))}, got {value!r}")
        settings.check(where)
        return settings

    def check(self, where: str = "recheck") -> None:
        """Refuse values that cannot work, naming the field.

        Raises:
            ConfigError: e.g. ``recheck.idle_share: a share of the CPUs in [0.01, 1], got 2``.
        """
        for name in ("busy_share", "idle_share"):
            v = getattr(self, name)
            if not 0.01 <= v <= 1.0:
                raise ConfigError(f"{where}.{name}: a share of the CPUs in [0.01, 1], got {v!r}")
        for name in ("idle_for_s", "after_s", "drift_for_s", "min_interval_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}.{name}: must be >= 0, got {getattr(self, name)!r}")
        for name in ("budget_s", "poll_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{where}.{name}: must be > 0, got {getattr(self, name)!r}")
        if self.max_rechecks < 0:
            raise ConfigError(f"{where}.max_rechecks: must be >= 0, got {self.max_rechecks!r}")
        for name in ("drift_ratio", "switch_gain"):
            if not getattr(self, name) > 1.0:
                raise ConfigError(f"{where}.{name}: a ratio above 1, got {getattr(self, name)!r}")
