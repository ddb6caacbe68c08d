"""``edgeinfer keygen`` and ``edgeinfer push-model``: sign and send model updates over MQTT.

    $ edgeinfer push-model face-v2.onnx --group line-3 --pipeline faces --version 2.0.0 \\
          --key ota-key --wait
    DEVICE  STATE      VERSION  REASON / MESSAGE                 SECONDS
    pi-a    committed  2.0.0    -                                3.0
    pi-b    committed  2.0.0    -                                5.9
    pi-c    rejected   2.0.0    wrong_task; refused: wrong_task  1.6
    edgeinfer: error: 1 of 3 devices not committed: pi-c rejected (wrong_task)

Progress and state changes go to stderr (a bar on a terminal, else a line per 10 %); the table
(or ``--json``: ``{"devices": [...], "skipped": [...]}``) to stdout; SECONDS count from the
start of the command to the device's last status. The exit code is 0 only when every target
committed (without ``--wait``: received the whole file; ``--rollback``: rolled back), else 65
(`edgeinfer.errors.OtaError`) with a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from ..errors import ConfigError, OtaError
from ._broker import add_broker_arguments, client_base

if TYPE_CHECKING:
    from ..config.mqtt import MqttConfig
    from ..ota.protocol import OtaStatus

__all__ = ["add_keygen_arguments", "add_push_model_arguments", "cmd_keygen", "cmd_push_model",
           "mqtt_config"]

_BAR_WIDTH = 30


def add_keygen_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write OUT (the private key, PEM, mode 0600) and OUT.pub (the public key, "
                     "one line: ed25519:<base64> <key id>) for devices' ota.trusted_keys.")
    p.add_argument("out", metavar="OUT", help="private key file to write")
    p.add_argument("--force", action="store_true", help="overwrite existing files")


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write the key pair; refuse to overwrite without ``--force``."""
    from ..keys import generate_keypair  # inside: not for `edgeinfer --help`

    private, public, key_id = generate_keypair(args.out, force=args.force)
    print(f"wrote {private} (private key, mode 0600: keep it secret) and {public}")
    print(f"key id {key_id}; list {public} in each device's ota.trusted_keys")
    return 0


def add_push_model_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Sign MODEL's manifest and send it in chunks over MQTT to a device or a "
                     "group, resending what a device reports missing; with --wait, print each "
                     "device's final status. --rollback asks the devices to go back to their "
                     "previous model.")
    p.add_argument("model", nargs="?", metavar="MODEL", help="ONNX or TFLite file to push")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--device", action="append", metavar="ID",
                        help="target device id (repeatable)")
    target.add_argument("--group", metavar="NAME", help="target every device of this group")
    p.add_argument("--pipeline", required=True, help="the pipeline whose model is replaced")
    p.add_argument("--version", dest="model_version", help="version string for the manifest "
                   "(required unless --rollback)")
    p.add_argument("--name", help="model name (default: the file name's stem)")
    p.add_argument("--task", help="the task the model is for (classify, detect, vad, raw); "
                   "devices refuse it for a pipeline running another task")
    p.add_argument("--golden", metavar="NPZ",
                   help="golden inputs (and expected outputs as out:<name>) the devices check")
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="absolute tolerance for golden outputs (default: %(default)s)")
    p.add_argument("--key", help="private key from `edgeinfer keygen` (omit only for devices "
                   "with ota.allow_unsigned)")
    p.add_argument("--rollback", action="store_true",
                   help="ask the devices to return to their previous model")
    p.add_argument("--canary", type=int, default=0, metavar="N",
                   help="with --group: push to N devices first, go on only when they commit")
    p.add_argument("--wait", action="store_true",
                   help="wait for each device's final status and print a table")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="give up waiting after S seconds (default: %(default)s)")
    p.add_argument("--chunk-kb", type=int, default=256, metavar="KB",
                   help="chunk size, 64-512 KiB (default: %(default)s)")
    p.add_argument("--sequence", type=int, metavar="N",
                   help="the pipeline's update sequence (default: the time in ms); devices "
                   "refuse one not above the highest they installed")
    p.add_argument("--downgrade", action="store_true",
                   help="sign a deliberate downgrade: allowed below the installed sequence")
    p.add_argument("--ttl", type=float, default=3600.0, metavar="S",
                   help="the signed manifest expires after S seconds (default: %(default)s)")
    add_broker_arguments(p)
    p.add_argument("--json", action="store_true", help="final statuses as JSON")


def cmd_push_model(args: argparse.Namespace) -> int:
    """Push MODEL (or a rollback request) and report each target's outcome."""
    # Inside, not at the top: these import msgspec (the client paho too) at their top, and
    # `edgeinfer --help` imports this module.
    from ..mqtt.client import MqttClient
    from ..ota.push import Pusher

    _check(args)
    key = _key(args)
    config = mqtt_config(args)
    try:
        client = MqttClient(config, "push", announce=False)
    except ValueError as exc:  # a --prefix that is no topic level
        raise ConfigError(f"--prefix: {exc}") from exc
    out = _Reporter(sys.stderr, quiet=args.json)
    pusher = Pusher(client, config.prefix)
    devices = args.device or None
    client.start()
    try:
        if args.rollback:
            statuses = pusher.rollback(devices=devices, group=args.group, pipeline=args.pipeline,
                                       key=key, wait=args.wait, timeout_s=args.timeout,
                                       on_status=out.status)
            if not args.wait:
                print(f"rollback of {args.pipeline} requested on "
                      f"{', '.join(devices or [f'group {args.group}'])}", file=sys.stderr)
                return 0
        else:
            statuses = pusher.push(
                args.model, devices=devices, group=args.group, pipeline=args.pipeline,
                version=args.model_version, key=key, name=args.name, task=args.task,
                golden_path=args.golden, tolerance=args.tolerance,
                chunk_size=args.chunk_kb * 1024, canary=args.canary, wait=args.wait,
                timeout_s=args.timeout, on_progress=out.progress, on_status=out.status,
                sequence=args.sequence, downgrade=args.downgrade, ttl_s=args.ttl)
    finally:
        out.end_bar()
        client.stop(timeout_s=1.0)
    goal = "rolled_back" if args.rollback else ("committed" if args.wait else "received")
    rows = _rows(statuses, pusher.timed_out, out.seen_at, goal)
    if args.json:
        print(json.dumps({"devices": rows, "skipped": pusher.skipped}, separators=(",", ":")))
    else:
        print(_table(rows))
    failed = [r for r in rows if not r["ok"]]
    if pusher.skipped:
        raise OtaError(f"canary failed ({_summary(failed)}); not pushed to "
                       f"{', '.join(pusher.skipped)}")
    if failed:
        wanted = {"rolled_back": "rolled back", "received": "received it"}.get(goal, goal)
        raise OtaError(f"{len(failed)} of {len(rows)} devices not {wanted}: {_summary(failed)}")
    return 0


def _check(args: argparse.Namespace) -> None:
    """Option errors the parser cannot see, before anything connects."""
    if args.rollback:
        if args.model:
            raise ConfigError("--rollback takes no MODEL")
        if args.canary:
            raise ConfigError("--canary does not apply to --rollback")
        return
    if not args.model:
        raise ConfigError("MODEL is required (or --rollback)")
    if not args.model_version:
        raise ConfigError("--version is required: the manifest needs a version string")
    if not 64 <= args.chunk_kb <= 512:
        raise ConfigError(f"--chunk-kb {args.chunk_kb}: must be 64-512")
    if args.canary < 0:
        raise ConfigError(f"--canary {args.canary}: must be >= 0")
    if args.canary and not args.group:
        raise ConfigError("--canary needs --group (it picks devices of the group)")
    if not args.tolerance > 0:
        raise ConfigError(f"--tolerance {args.tolerance}: must be > 0")
    if not args.timeout > 0:
        raise ConfigError(f"--timeout {args.timeout}: must be > 0")


def _key(args: argparse.Namespace) -> Any:
    if args.key:
        from ..keys import load_private_key  # inside: not for `edgeinfer --help`

        return load_private_key(args.key)
    print("edgeinfer: WARNING: no --key: this push is UNSIGNED; only devices with "
          "ota.allow_unsigned: true (development only) will take it", file=sys.stderr)
    return None


def mqtt_config(args: argparse.Namespace) -> MqttConfig:
    """The broker connection from ``-c`` and the ``--broker``/``--prefix``/credential/TLS
    options (options win over the config's ``mqtt:`` section)."""
    import msgspec  # inside, with our config: not for `edgeinfer --help`

    from ..config.mqtt import TlsConfig

    config, changes = client_base(args.config, "push", instead="--broker", initial_s=0.2,
                                  max_s=2.0)
    changes["embedded"] = False  # a pusher is a client of a device's broker, never one itself
    if args.broker:
        changes.update(_broker(args.broker))
    if args.prefix:
        changes["prefix"] = args.prefix
    if args.username:
        changes["username"] = args.username
    password = args.password or os.environ.get("EDGEINFER_MQTT_PASSWORD")
    if password:
        changes["password"] = password
    if args.tls or args.ca or args.cert or args.cert_key:
        if bool(args.cert) != bool(args.cert_key):
            raise ConfigError("give both --cert and --cert-key, or neither")
        for flag, value in (("--ca", args.ca), ("--cert", args.cert),
                            ("--cert-key", args.cert_key)):
            if value and not os.path.isfile(value):
                raise ConfigError(f"{flag} {value}: no such file" if not os.path.exists(value)
                                  else f"{flag} {value}: not a file")
        base = config.tls or TlsConfig()
        changes["tls"] = msgspec.structs.replace(
            base, ca_file=args.ca or base.ca_file, cert_file=args.cert or base.cert_file,
            key_file=args.cert_key or base.key_file)
    try:
        return msgspec.structs.replace(config, **changes)
    except (ValueError, msgspec.ValidationError) as exc:
        raise ConfigError(f"broker options: {exc}") from exc


def _broker(text: str) -> dict[str, Any]:
    host, port = text, None
    if text.startswith("["):  # [v6 address]:port
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, port = text.split(":")
    out: dict[str, Any] = {"host": host}
    if not host:
        raise ConfigError(f"--broker {text}: no host")
    if port is not None:
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ConfigError(f"--broker {text}: {port!r} is not a TCP port (1-65535)")
        out["port"] = int(port)
    return out


class _Reporter:
    """Progress on stderr: a bar on a terminal, else a line per 10 %; state changes as lines."""

    def __init__(self, stream: IO[str], *, quiet: bool) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.seen_at: dict[str, float] = {}
        self._states: dict[str, str] = {}
        self._decile = -1
        self._last = -1
        self._bar_open = False

    def progress(self, done: int, total: int) -> None:
        if done < self._last:  # a new phase (the group after the canary)
            self.end_bar()
            self._decile = -1
        self._last = done
        fraction = done / total if total else 1.0
        if self.tty:
            filled = int(fraction * _BAR_WIDTH)
            self.stream.write(f"\r[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
                              f"{fraction:4.0%}  {_mib(done)}/{_mib(total)} MiB")
            self.stream.flush()
            self._bar_open = True
        elif int(fraction * 10) > self._decile:
            self._decile = int(fraction * 10)
            print(f"edgeinfer push-model: {self._decile * 10}% ({_mib(done)}/{_mib(total)} MiB)",
                  file=self.stream, flush=True)

    def status(self, status: OtaStatus) -> None:
        self.seen_at[status.device] = time.monotonic() - self.t0
        if self._states.get(status.device) == status.state:
            return
        self._states[status.device] = status.state
        if self.quiet and not self.tty:
            return
        self.end_bar()
        why = f" ({status.reason})" if status.reason else ""
        print(f"edgeinfer push-model: {status.device} {status.state}{why}", file=self.stream,
              flush=True)

    def end_bar(self) -> None:
        if self._bar_open:
            self.stream.write("\n")
            self.stream.flush()
            self._bar_open = False


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f}"


def _rows(statuses: dict[str, OtaStatus], timed_out: list[str], seen_at: dict[str, float],
          goal: str) -> list[dict[str, Any]]:
    """A row per target; ``ok`` when it reached ``goal`` (``committed``, ``rolled_back``, or
    ``received``: past ``receiving`` and neither rejected nor rolled back)."""
    import msgspec  # inside: as in mqtt_config

    from ..ota.push import PAST_RECEIVING  # inside: msgspec

    rows = []
    for device in sorted(set(statuses) | set(timed_out)):
        s = statuses.get(device)
        late = device in timed_out
        if s is None:
            ok = False
        elif goal == "received":
            ok = s.state in PAST_RECEIVING and s.state not in ("rejected", "rolled_back")
        else:
            ok = s.state == goal
        rows.append({
            "device": device,
            "state": s.state if s is not None else None,
            "version": s.version if s is not None else None,
            "reason": s.reason if s is not None else None,
            "message": s.message if s is not None else "no answer",
            "seconds": round(seen_at[device], 1) if device in seen_at else None,
            "timed_out": late,
            "ok": ok and not late,
            "status": msgspec.to_builtins(s) if s is not None else None,
        })
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = ("DEVICE", "STATE", "VERSION", "REASON / MESSAGE", "SECONDS")
    lines = [head]
    for r in rows:
        note = "; ".join(str(v) for v in (r["reason"], r["message"]) if v)
        if r["timed_out"]:
            note = "; ".join(v for v in ("timed out", note) if v)
        seconds = f"{r['seconds']:.1f}" if r["seconds"] is not None else "-"
        lines.append((r["device"], r["state"] or "-", r["version"] or "-", note or "-", seconds))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths, strict=True))
                     + "  " + line[-1] for line in lines)


def _summary(rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        what = "timed out" if r["timed_out"] else (r["state"] or "no answer")
        parts.append(f"{r['device']} {what}" + (f" ({r['reason']})" if r["reason"] else ""))
    return ", ".join(parts) or "no device answered"
