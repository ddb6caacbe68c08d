"""``edgeinfer watch``: subscribe to devices' results, events, counts, status and stats and
print them.

One line per message, results formatted as the ``stdout`` sink writes them::

    cam1 faces #12 frame 36 3.1 ms  face 0.93 [101,52,188,160]
    cam1 status online  version 0.1.0  pipelines: faces
    cam1 stats faces 29.8 fps infer p50 3.1 p99 4.0 ms  memory 95.2 MiB  outbox 0 waiting
    cam1 faces event cross gate in  face #4 0.91 frame 120
    cam1 faces counts zone door 1 inside (5 entered, 4 left)  line gate in 7 out 4
"""

from __future__ import annotations

import argparse
import json
import queue
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..mqtt.topics import check_level
from ._broker import listener_config

if TYPE_CHECKING:
    from ..config.mqtt import MqttConfig
    from ..mqtt.client import Message

__all__ = ["add_watch_arguments", "cmd_watch", "describe", "result_from_dict"]

_MAX_LINE = 240


def add_watch_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Subscribe to <prefix>/<device>/status, .../<pipeline>/result, "
                     ".../<pipeline>/event, .../<pipeline>/counts and .../stats and print one "
                     "line per message. The broker is the -c CONFIG's mqtt: section, else "
                     "127.0.0.1:1883; options override it. A broker that is down is retried. "
                     "Ctrl-C ends it.")
    p.add_argument("-c", "--config", help="YAML config whose mqtt: section names the broker")
    p.add_argument("--device", help="only this device id (default: every device)")
    p.add_argument("--prefix", help="first topic level (default: the config's, or edgeinfer)")
    p.add_argument("--host", help="broker host (default: the config's, or 127.0.0.1)")
    p.add_argument("--port", type=int, help="broker port (default: the config's, or 1883)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per message: topic, device, kind, retained, payload")
    p.add_argument("--count", type=int, metavar="N", help="exit after N results")


def cmd_watch(args: argparse.Namespace) -> int:
    """Print messages until Ctrl-C (exit 0) or ``--count`` results.

    Ctrl-C only sets a flag that the loop reads (a second one interrupts at once): a
    KeyboardInterrupt raised anywhere in the main thread could leave a lock of the inbox held
    (CPython runs the handler right after a C call such as a lock's acquire, before the
    ``with`` block that releases it is entered), and the network thread would wait on it for
    good. The network thread never waits on the printing either: when the inbox is full
    (printing slower than the broker sends), messages are dropped and counted.
    """
    from ..mqtt.client import MqttClient  # inside: msgspec and paho, not for `edgeinfer --help`

    config = _config(args)
    device = args.device or "+"
    if args.device:
        try:
            check_level(args.device, "--device")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    prefix = config.prefix
    # Status last: its retained message then shows the other subscriptions are in place.
    filters = [f"{prefix}/{device}/+/result", f"{prefix}/{device}/+/event",
               f"{prefix}/{device}/+/counts", f"{prefix}/{device}/stats",
               f"{prefix}/{device}/status"]
    try:
        client = MqttClient(config, "watch", announce=False)
    except ValueError as exc:  # a --prefix that is no topic level
        raise ConfigError(f"--prefix: {exc}") from exc
    inbox = _Inbox(_INBOX)
    for topic in filters:
        client.subscribe(topic, 1, inbox.put)
    where = f"{config.host}:{config.resolved_port()}"
    print(f"edgeinfer watch: {', '.join(filters)} on {where}", file=sys.stderr, flush=True)
    results = 0
    state = ""
    interrupt = _Interrupt()
    with interrupt:
        client.start()
        try:
            while not interrupt.asked and (args.count is None or results < args.count):
                if client.state != state:
                    state = client.state
                    _say_state(client, where)
                msg = inbox.get(_POLL_S)
                if msg is None:
                    continue
                kind, line = describe(msg.topic, msg.payload, prefix, as_json=args.json,
                                      retained=msg.retain)
                print(line, flush=True)
                results += kind == "result"
        except KeyboardInterrupt:  # the second Ctrl-C
            pass
        finally:
            client.stop(timeout_s=1.0)
    if inbox.dropped:
        print(f"edgeinfer watch: {inbox.dropped} messages dropped (printing could not keep up)",
              file=sys.stderr, flush=True)
    return 0


_INBOX = 10_000
_POLL_S = 0.25


class _Inbox:
    """Messages from the network thread to the printing loop; ``put`` never waits."""

    def __init__(self, size: int) -> None:
        self._queue: queue.Queue[Message] = queue.Queue(maxsize=size)
        self.dropped = 0

    def put(self, msg: Message) -> None:
        try:
            self._queue.put_nowait(msg)
        except queue.Full:
            self.dropped += 1  # only the network thread writes it
            if self.dropped == 1:  # said once now (the loop may be stuck printing), all at exit
                print("edgeinfer watch: messages dropped: printing cannot keep up with the "
                      "broker", file=sys.stderr, flush=True)

    def get(self, timeout: float) -> Message | None:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


class _Interrupt:
    """While the block runs (in the main thread; elsewhere nothing changes), SIGINT sets
    ``asked``; a second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.asked = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True


def _say_state(client: Any, where: str) -> None:
    # Failures (refused, credentials, TLS) are logged by the client itself, once per condition.
    if client.state == "connected":
        print(f"edgeinfer watch: connected to {where}", file=sys.stderr, flush=True)
    elif client.state == "disconnected":
        print(f"edgeinfer watch: lost {where}; reconnecting", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> MqttConfig:
    return listener_config(args, "watch", initial_s=0.5, max_s=5.0)


def describe(topic: str, payload: bytes, prefix: str, *, as_json: bool = False,
             retained: bool = False) -> tuple[str, str]:
    """``(kind, line)`` for one message: kind ``result``, ``event``, ``counts``, ``status``,
    ``stats`` or ``other``."""
    levels = topic[len(prefix) + 1:].split("/") if topic.startswith(prefix + "/") else []
    device = levels[0] if levels else "?"
    kind = levels[-1] if len(levels) >= 2 and levels[-1] in _KINDS else "other"
    try:
        data: Any = json.loads(payload)
    except (ValueError, RecursionError):  # any bytes a client sent
        data = None
    if as_json:
        body = data if data is not None else payload.decode("utf-8", "replace")
        return kind, json.dumps({"topic": topic, "device": device, "kind": kind,
                                 "retained": retained, "payload": body}, separators=(",", ":"))
    if not isinstance(data, dict):
        return kind, f"{device} {topic}: {payload[:80].decode('utf-8', 'replace')!r}"
    if kind == "result":
        line = _result_line(data)
    elif kind == "event":
        from ..sinks.stdout import format_event  # inside: numpy

        line = format_event(str(data.get("pipeline", levels[-2] if len(levels) > 2 else "?")),
                            data)
    elif kind == "counts":
        line = f"{levels[-2] if len(levels) > 2 else '?'} counts " + _counts_line(data)
    elif kind == "status":
        line = _status_line(data) + (" (retained)" if retained else "")
    elif kind == "stats":
        line = "stats " + _stats_line(data, _MAX_LINE - len(device) - 7)
    else:
        line = f"{topic} {_scalars(data)}"
    # Any client on the broker may send labels with terminal escapes: never print them raw.
    return kind, f"{device} {line}"[:_MAX_LINE].translate(_UNPRINTABLE)


_KINDS = ("result", "event", "counts", "status", "stats")
_UNPRINTABLE = {c: "?" for c in (*range(0x20), *range(0x7f, 0xa0))}


def _counts_line(data: dict[str, Any]) -> str:
    """``zone door 2 inside (5 in, 3 out)  line gate in 7 out 4``."""
    parts: list[str] = []
    zones, lines = data.get("zones"), data.get("lines")
    for name, c in (zones.items() if isinstance(zones, dict) else ()):
        if isinstance(c, dict):
            parts.append(f"zone {name} {c.get('occupancy', '?')} inside "
                         f"({c.get('entered', '?')} entered, {c.get('exited', '?')} left)")
    for name, c in (lines.items() if isinstance(lines, dict) else ()):
        if isinstance(c, dict):
            parts.append(f"line {name} in {c.get('in', '?')} out {c.get('out', '?')}")
    return "  ".join(parts) or "none"


def _result_line(data: dict[str, Any]) -> str:
    from ..sinks.stdout import format_line  # inside: numpy

    try:
        return format_line(result_from_dict(data))
    except (KeyError, TypeError, ValueError, IndexError):
        return f"{data.get('pipeline', '?')} #{data.get('seq', '?')} (result not understood)"


def result_from_dict(data: dict[str, Any]) -> Any:
    """A `edgeinfer.frames.Result` back from its JSON form (the frame without pixels); the
    task part is read by its kind (`edgeinfer.frames.part_from_dict`)."""
    import numpy as np

    from ..frames import Frame, Latency, ModelRef, Result, part_from_dict  # inside: numpy

    frame = data.get("frame") or {}
    lat = data.get("latency_ms") or {}
    model = data.get("model") or {}
    return Result(
        seq=int(data["seq"]), ts=float(data.get("ts", 0.0)), pipeline=str(data["pipeline"]),
        frame=Frame(int(frame.get("index", 0)), 0.0, float(frame.get("ts", 0.0)),
                    np.empty(0, np.uint8)),
        model=ModelRef(str(model.get("name", "")), model.get("version"), str(model.get("sha256", ""))),
        provider=str(data.get("provider", "")),
        latency_ms=Latency(float(lat.get("pre", 0)), float(lat.get("infer", 0)),
                           float(lat.get("post", 0))),
        task=part_from_dict(data),
    )


def _status_line(data: dict[str, Any]) -> str:
    parts = [f"status {data.get('state', '?')}"]
    if data.get("version"):
        parts.append(f"version {data['version']}")
    for key in ("pipelines", "models", "providers", "failed", "error", "reason"):
        value = data.get(key)
        if isinstance(value, list) and value:
            parts.append(f"{key}: " + ", ".join(map(str, value)))
        elif isinstance(value, dict) and value:  # by pipeline: a model is shown by its name
            parts.append(f"{key}: " + ", ".join(
                f"{k}={v.get('name', '?') if isinstance(v, dict) else v}" for k, v in value.items()))
        elif value and isinstance(value, (str, int, float)):
            parts.append(f"{key}: {value}")
    health = data.get("health")
    if isinstance(health, dict):  # a pipeline whose camera cannot be read, paused, failed
        unwell = [f"{name}={h.get('state')}" + (f" ({h['reason']})" if h.get("reason") else "")
                  for name, h in health.items()
                  if isinstance(h, dict) and h.get("state") not in ("running", None)]
        if unwell:
            parts.append("not running: " + ", ".join(unwell))
    return "  ".join(parts)


def _stats_line(data: dict[str, Any], budget: int = _MAX_LINE) -> str:
    """Per pipeline: fps, inference latency (every processed frame) and end-to-end latency
    (source to sink, of the emitted results only, so labelled with their count); then memory,
    the outbox, failures and other scalars. Cut between fields, never inside one."""
    parts: list[str] = []
    pipelines = data.get("pipelines")
    if isinstance(pipelines, dict):
        pipelines = [{"pipeline": k, **v} for k, v in pipelines.items() if isinstance(v, dict)]
    for p in pipelines if isinstance(pipelines, list) else []:
        if isinstance(p, dict):
            parts.append(_pipeline_stats(p))
    rest = {k: v for k, v in data.items() if k not in ("pipelines", "outbox", "memory_mb", "memory",
                                                         "uptime_s", "failed", "commands")}
    outbox = data.get("outbox")
    if isinstance(outbox, dict):
        parts.append(_outbox_stats(outbox))
    tree = data.get("memory")
    if isinstance(tree, dict) and isinstance(tree.get("pss_mb"), (int, float)) \
            and isinstance(tree.get("processes"), int) and tree["processes"] > 1:
        parts.append(f"memory {tree['pss_mb']} MiB PSS in {tree['processes']} processes")
    elif isinstance(data.get("memory_mb"), (int, float)):
        parts.append(f"memory {data['memory_mb']} MiB")
    commands = data.get("commands")
    if isinstance(commands, dict):
        parts.append(f"commands {commands.get('received', '?')}" + "".join(
            f" {commands[k]} {k}" for k in ("errors", "ignored") if commands.get(k))
            + ("" if commands.get("state", "running") == "running" else f" {commands['state']}"))
    failed = data.get("failed")
    if isinstance(failed, dict) and failed:
        parts.append("not started: " + ", ".join(map(str, failed)))
    if isinstance(data.get("uptime_s"), (int, float)):
        parts.append(f"up {data['uptime_s']:.0f} s")
    scalars = _scalars(rest)
    if scalars:
        parts.append(scalars)
    return _fit(parts, budget)


def _pipeline_stats(p: dict[str, Any]) -> str:
    text = f"{p.get('pipeline', p.get('name', '?'))} {_num(p.get('fps', 0))} fps"
    if p.get("state") not in (None, "running"):
        text += f" {p['state']}"
    given = p.get("latency_ms")
    lat: dict[str, Any] = given if isinstance(given, dict) else {}
    infer, e2e = lat.get("infer"), lat.get("end_to_end")
    if isinstance(infer, dict) and "p50" in infer:
        text += f" infer p50 {_num(infer['p50'])} p99 {_num(infer.get('p99'))} ms"
    wait, shared = lat.get("wait"), p.get("shared")
    if isinstance(wait, dict) and isinstance(shared, dict) \
            and len(shared.get("pipelines") or ()) > 1:  # the model is shared: its wait for it
        text += f" wait p50 {_num(wait.get('p50'))} ms"
    if isinstance(e2e, dict) and "p50" in e2e:
        emitted = p.get("emitted")
        text += f" e2e p50 {_num(e2e['p50'])} p99 {_num(e2e.get('p99'))} ms"
        if isinstance(emitted, int):
            text += f" ({emitted} emitted of {p.get('processed', '?')})"
    dropped = p.get("dropped")
    lost = sum(v for v in dropped.values() if isinstance(v, int)) if isinstance(dropped, dict) \
        else dropped
    for label, value in (("dropped", lost), ("errors", p.get("errors"))):
        if isinstance(value, int) and value:
            text += f" {label} {value}"
    return text


def _num(value: Any) -> str:
    return f"{value:.1f}" if isinstance(value, float) else str(value if value is not None else "?")


def _outbox_stats(o: dict[str, Any]) -> str:
    text = f"outbox {o.get('depth', '?')} waiting"
    for key in ("in_flight", "dropped"):
        if o.get(key):
            text += f" {o[key]} {key.replace('_', ' ')}"
    if o.get("connected") is False:
        text += f" (broker {o.get('broker', '?')} not connected)"
    elif o.get("protocol"):
        text += f" via MQTT {o['protocol']}"
    if o.get("disk_full"):
        text += " DISK FULL"
    return text


def _fit(parts: list[str], budget: int) -> str:
    """``parts`` joined by two spaces: as many whole ones as fit in ``budget`` characters, and
    ``(+N more)`` when some do not."""
    for keep in range(len(parts), 0, -1):
        more = f"  (+{len(parts) - keep} more)" if keep < len(parts) else ""
        text = "  ".join(parts[:keep]) + more
        if len(text) <= budget:
            return text
    return parts[0][:budget] if parts else ""


def _scalars(data: dict[str, Any], prefix: str = "") -> str:
    """``key=value`` for the numbers, strings and booleans, one level of nesting deep."""
    items: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict) and not prefix:
            inner = _scalars(value, f"{key}.")
            if inner:
                items.append(inner)
        elif isinstance(value, (int, float, str, bool)) and key not in ("ts", "device"):
            items.append(f"{prefix}{key}={value}")
    return " ".join(items)
