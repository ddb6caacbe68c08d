"""What ``edgeinfer fleet`` shows: each device's retained status and latest stats, gathered from
``<prefix>/+/status`` and ``<prefix>/+/stats`` and folded into one `DeviceInfo` per device.

Every message is untrusted input: any client on the broker may publish anything under the prefix.
A message that is not a JSON object, or fields of the wrong type, leave the fields unknown
(``None``); text is cut to a width and stripped of control characters before it is shown, and
the number of devices and pipelines kept is bounded. Over the device cap the devices seen least
recently are dropped (and counted), so a flood of fake ids cannot hide a device that announced
itself after it; ids that look like another's (a Cyrillic ``і`` for ``i``, fullwidth letters,
mixed scripts) are marked (`confusable`).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceInfo", "Fleet", "PipelineInfo", "clean", "confusable", "render_table",
           "skeleton"]

MAX_DEVICES = 10_000
MAX_SKEW_S = 600.0  # a device time further ahead of the receive time ranks as no time at all
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
        confusable: Why the id may not be what it looks like: it looks like another listed
            id, or mixes scripts (``None``: plain).
    """

    device: str
    state: str
    version: str | None
    pipelines: tuple[PipelineInfo, ...]
    failed: dict[str, str]
    outbox: int | None
    last_seen: float | None
    problem: str | None
    confusable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``edgeinfer fleet --json``)."""
        return {"device": self.device, "state": self.state, "version": self.version,
                "pipelines": [{"name": p.name, "backend": p.backend, "model": p.model,
                               "model_version": p.model_version, "fps": p.fps}
                              for p in self.pipelines],
                "failed": self.failed, "outbox": self.outbox, "last_seen": self.last_seen,
                "problem": self.problem, "confusable": self.confusable}


class Fleet:
    """Devices gathered from status and stats messages (not thread-safe: feed it from one thread).

    At most ``max_devices`` are kept: past it the device seen least recently (its newest device
    time, or when a live message of it arrived; a time more than ``MAX_SKEW_S`` ahead counts as
    none, ties go to the later arrival) is dropped and counted in ``dropped``.

    Args:
        prefix: The devices' topic prefix.
        max_devices: How many devices are kept (``None``: ``MAX_DEVICES``).
    """

    def __init__(self, prefix: str, max_devices: int | None = None) -> None:
        max_devices = MAX_DEVICES if max_devices is None else max_devices
        if max_devices < 1:
            raise ValueError(f"max_devices must be at least 1, not {max_devices}")
        self.prefix = prefix
        self.max_devices = max_devices
        self.ignored = 0
        self.dropped = 0
        self._status: dict[str, dict[str, Any]] = {}
        self._stats: dict[str, dict[str, Any]] = {}
        self._heard: dict[str, float] = {}
        # Least recently seen first; an entry is stale when its rank is not the device's own.
        self._rank: dict[str, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._arrival = itertools.count()

    def add(self, topic: str, payload: bytes, *, retained: bool = False,
            received: float | None = None) -> bool:
        """Take one message; ``False`` (and counted in ``ignored``) when it is not a device's
        status or stats, is too big or is not a JSON object. A device past ``max_devices``
        drops the one seen least recently (counted in ``dropped``; ``False`` when that is
        this message's own device)."""
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
        if not isinstance(doc, dict):
            self.ignored += 1
            return False
        now = time.time() if received is None else received
        (self._status if levels[1] == "status" else self._stats)[device] = doc
        if not retained:
            self._heard[device] = now
        self._rerank(device, now)
        while len(self._rank) > self.max_devices:
            self._drop_oldest()
        return device in self._rank

    def _rerank(self, device: str, now: float) -> None:
        seen = [t for t in (self._seen(self._status.get(device)),
                            self._seen(self._stats.get(device)), self._heard.get(device))
                if t is not None and t <= now + MAX_SKEW_S]
        rank = (max(seen) if seen else 0.0, next(self._arrival))
        self._rank[device] = rank
        heapq.heappush(self._heap, (*rank, device))
        if len(self._heap) > 4 * len(self._rank) + 64:  # updates leave stale entries
            self._heap = [(*r, d) for d, r in self._rank.items()]
            heapq.heapify(self._heap)

    @staticmethod
    def _seen(doc: dict[str, Any] | None) -> float | None:
        return _time(doc.get("ts")) if doc is not None else None

    def _drop_oldest(self) -> None:
        while self._heap:
            t, n, device = heapq.heappop(self._heap)
            if self._rank.get(device) == (t, n):
                del self._rank[device]
                self._status.pop(device, None)
                self._stats.pop(device, None)
                self._heard.pop(device, None)
                self.dropped += 1
                return

    def devices(self) -> list[DeviceInfo]:
        """Every device kept, sorted by id; ids confusable with another are marked."""
        names = sorted(self._rank)
        marks = confusable(names)
        return [self._device(name, marks.get(name)) for name in names]

    def _device(self, name: str, mark: str | None) -> DeviceInfo:
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
            problem=clean(status.get("problem"), 120),
            confusable=mark)


# Letters of other scripts (and Latin ones) drawn like a Latin letter or digit: a subset of
# Unicode's confusables (UTS #39) covering what a keyboard layout or a lookalike attack gives.
_LOOKALIKE = str.maketrans({
    **dict(zip("аеіјорсуххѕԁһӏԛԝүвкмнт", "aeijopcyxxsdhlqwyBkMHT", strict=True)),
    **dict(zip("АВЕКМНОРСТХІЈЅҮЗ", "ABEKMHOPCTXIJSY3", strict=True)),
    **dict(zip("οιρνκυταχ", "oipvkutax", strict=True)),
    **dict(zip("ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ", "ABEZHIKMNOPTYX", strict=True)),
    **dict(zip("ıɑɡɩʟ", "iagil", strict=True)),
    "0": "O", "o": "O", "1": "l", "I": "l", "|": "l", "i": "l",
})


def skeleton(name: str) -> str:
    """What ``name`` looks like: NFKC, invisible characters and combining marks dropped,
    lookalike letters and digits folded to one Latin form (``cam1``, ``caml``, ``cam\u0456``
    and fullwidth ``ｃａｍ1`` share one)."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", name))
    text = "".join(c for c in text if unicodedata.category(c) not in ("Mn", "Me", "Cf"))
    # Twice: a Cyrillic i folds to the Latin i, which folds on with 1, I and l.
    return unicodedata.normalize("NFKC", text).translate(_LOOKALIKE).translate(_LOOKALIKE)


def _scripts(name: str) -> set[str]:
    return {unicodedata.name(c, "UNKNOWN ?").split()[0] for c in name if c.isalpha()}


def confusable(names: list[str]) -> dict[str, str]:
    """The ids among ``names`` that are not what they look like, with why: one that looks
    like another id of the list, one whose letters mix scripts, or one with characters
    that are invisible or change under NFKC."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(skeleton(name), []).append(name)
    marks: dict[str, str] = {}
    for name in names:
        why = [f"the id is {clean(_escaped(name), 40)}"]
        others = [n for n in groups[skeleton(name)] if n != name]
        if others:
            more = f" and {len(others) - 1} more" if len(others) > 1 else ""
            why.append(f"looks like {clean(_escaped(others[0]), 40)}{more}")
        scripts = _scripts(name)
        if len(scripts) > 1:
            why.append("mixes scripts (" + ", ".join(sorted(scripts))[:60] + ")")
        if unicodedata.normalize("NFKC", name) != name or any(
                unicodedata.category(c) == "Cf" for c in name):
            why.append("has invisible characters or is not in NFKC form")
        if len(why) > 1:
            marks[name] = "; ".join(why)
    return marks


def _escaped(name: str) -> str:
    return name.encode("ascii", "backslashreplace").decode()


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
    for note in (d.problem, d.confusable and f"CONFUSABLE: {d.confusable}"):
        if note:
            text = f"{text}; {note}" if text else note
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
