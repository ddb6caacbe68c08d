"""What ``edgeinfer fleet`` shows: each device's retained status and latest stats, gathered from
``<prefix>/+/status`` and ``<prefix>/+/stats`` and folded into one `DeviceInfo` per device.

Every message is untrusted input: any client on the broker may publish anything under the prefix.
A message that is not a JSON object, or fields of the wrong type, leave the fields unknown
(``None``); text is cut to a width and stripped of control characters before it is shown, and
the number of devices and pipelines kept is bounded.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceInfo", "Fleet", "PipelineInfo", "clean", "render_table"]

MAX_DEVICES = 10_000
MAX_PIPELINES = 64
MAX_PAYLOAD = 256 * 1024
MAX_TEXT = 64
_STATES = ("online", "offline", "stopped")


def clean(value: Any, width: int = MAX_TEXT) -> str | None:
    """``value`` as text safe for a terminal: unprintable characters (control characters,
    bidirectional overrides) replaced by ``?``, at most
    ``width`` characters (cut with ``~``); ``None`` for anything but a string or a number."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None
    text = str(value)
    if len(text) > width:
        text = text[:width - 1] + "~"
    # Terminal escapes and bidirectional overrides alike: anything Python calls unprintable.
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


@dataclass(frozen=True, slots=True)
class PipelineInfo:
    """One pipeline of a device.

    Attributes:
        name: The pipeline's name.
        backend: What runs its model (the status's ``backends[p].choice``).
        model: The model's name.
        model_version: The model's version.
        fps: Frames per second from the latest stats (``None``: no stats seen).
    """

    name: str
    backend: str | None
    model: str | None
    model_version: str | None
    fps: float | None


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device as its retained status and latest stats describe it.

    Attributes:
        device: The device id (its topic level).
        state: ``online``, ``offline``, ``stopped`` or ``unknown`` (no status, or an odd one).
        version: The edgeinfer version it runs.
        pipelines: Its pipelines.
        failed: Pipelines that did not start, with the reason.
        outbox: Messages waiting in its outbox (from the stats).
        last_seen: The newest device time (Unix s) of its status or stats, else when a
            non-retained message of it arrived.
        problem: A problem the device announces on its status (a dead command thread).
    """

    device: str
    state: str
    version: str | None
    pipelines: tuple[PipelineInfo, ...]
    failed: dict[str, str]
    outbox: int | None
    last_seen: float | None
    problem: str | None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``edgeinfer fleet --json``)."""
        return {"device": self.device, "state": self.state, "version": self.version,
                "pipelines": [{"name": p.name, "backend": p.backend, "model": p.model,
                               "model_version": p.model_version, "fps": p.fps}
                              for p in self.pipelines],
                "failed": self.failed, "outbox": self.outbox, "last_seen": self.last_seen,
                "problem": self.problem}


class Fleet:
    """Devices gathered from status and stats messages (not thread-safe: feed it from one thread).

    Args:
        prefix: The devices' topic prefix.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.ignored = 0
        self._status: dict[str, dict[str, Any]] = {}
        self._stats: dict[str, dict[str, Any]] = {}
        self._heard: dict[str, float] = {}

    def add(self, topic: str, payload: bytes, *, retained: bool = False,
            received: float | None = None) -> bool:
        """Take one message; ``False`` (and counted in ``ignored``) when it is not a device's
        status or stats, is too big, is not a JSON object, or is one device too many."""
        head = self.prefix + "/"
        levels = topic[len(head):].split("/") if topic.startswith(head) else []
        if len(levels) != 2 or levels[1] not in ("status", "stats") or not levels[0] \
                or len(payload) > MAX_PAYLOAD:
            self.ignored += 1
            return False
        device = levels[0]
        try:
            doc = json.loads(payload)
        except (ValueError, RecursionError):
            doc = None
        known = device in self._status or device in self._stats
        if not isinstance(doc, dict) or (not known and self._count() >= MAX_DEVICES):
            self.ignored += 1
            return False
        (self._status if levels[1] == "status" else self._stats)[device] = doc
        if not retained:
            self._heard[device] = time.time() if received is None else received
        return True

    def _count(self) -> int:
        return len(self._status.keys() | self._stats.keys())

    def devices(self) -> list[DeviceInfo]:
        """Every device seen, sorted by id."""
        names = sorted(self._status.keys() | self._stats.keys())
        return [self._device(name) for name in names]

    def _device(self, name: str) -> DeviceInfo:
        status = self._status.get(name, {})
        stats = self._stats.get(name, {})
        state = status.get("state")
        outbox = stats.get("outbox")
        depth = outbox.get("depth") if isinstance(outbox, dict) else None
        failed = _mapping(status.get("failed")) or _mapping(stats.get("failed"))
        seen = [t for t in (_time(status.get("ts")), _time(stats.get("ts")),
                            self._heard.get(name)) if t is not None]
        return DeviceInfo(
            device=clean(name) or "?",
            state=state if state in _STATES else "unknown",
            version=clean(status.get("version")),
            pipelines=_pipelines(status, stats),
            failed={clean(k) or "?": clean(v, 120) or "?"
                    for k, v in list(failed.items())[:MAX_PIPELINES]},
            outbox=depth if type(depth) is int and depth >= 0 else None,
            last_seen=max(seen) if seen else None,
            problem=clean(status.get("problem"), 120))


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _time(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and 0 < value < 4_102_444_800:
        return float(value)
    return None


def _pipelines(status: dict[str, Any], stats: dict[str, Any]) -> tuple[PipelineInfo, ...]:
    names = status.get("pipelines")
    running = _mapping(stats.get("pipelines"))
    if not isinstance(names, list):  # no status (or a junk one): what the stats name
        names = list(running)
    backends, models = _mapping(status.get("backends")), _mapping(status.get("models"))
    out: list[PipelineInfo] = []
    for name in names[:MAX_PIPELINES]:
        if not isinstance(name, str):
            continue
        backend, model = _mapping(backends.get(name)), _mapping(models.get(name))
        fps = _mapping(running.get(name)).get("fps")
        out.append(PipelineInfo(
            name=clean(name) or "?", backend=clean(backend.get("choice")),
            model=clean(model.get("name")), model_version=clean(model.get("version")),
            fps=float(fps) if isinstance(fps, (int, float)) and not isinstance(fps, bool)
            and math.isfinite(fps) else None))
    return tuple(out)


_COLUMNS = ("DEVICE", "STATE", "VERSION", "PIPELINE", "BACKEND", "MODEL", "FPS", "OUTBOX",
            "LAST SEEN", "FAILED")
_WIDTHS = (32, 7, 16, 24, 28, 40, 7, 8, 20, 60)  # a table line stays under 250 characters


def render_table(devices: list[DeviceInfo], now: float | None = None) -> str:
    """A plain-text table, one line per pipeline (a device without pipelines gets one line);
    device columns are shown on a device's first line only."""
    now = time.time() if now is None else now
    rows: list[tuple[str, ...]] = []
    for d in devices:
        head = (d.device, d.state, d.version or "-")
        tail = (str(d.outbox) if d.outbox is not None else "-", _ago(d.last_seen, now),
                _failed(d))
        for i, p in enumerate(d.pipelines or (None,)):
            cells = ("-", "-", "-", "-") if p is None else (
                p.name, p.backend or "-",
                f"{p.model or '-'} {p.model_version}" if p.model_version else p.model or "-",
                f"{p.fps:.1f}" if p.fps is not None else "-")
            row = (*head, *cells, *tail) if i == 0 else ("", "", "", *cells, "", "", "")
            rows.append(tuple(c if len(c) <= w else c[:w - 1] + "~"
                              for c, w in zip(row, _WIDTHS, strict=True)))
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in (_COLUMNS, *rows)]
    return "\n".join(lines)


def _failed(d: DeviceInfo) -> str:
    text = ", ".join(d.failed)
    if d.problem:
        text = f"{text}; {d.problem}" if text else d.problem
    return text or "-"


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    age = max(0.0, now - ts)
    if age < 120:
        return f"{age:.0f} s ago"
    if age < 7200:
        return f"{age / 60:.0f} min ago"
    if age < 172_800:
        return f"{age / 3600:.0f} h ago"
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + " UTC"
