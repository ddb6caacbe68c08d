"""The ``edgeinfer`` command: parsing, logging set-up, and the one place errors become exit codes.

Each verb lives in a sibling module: its handler and, next to it, the function that describes its
arguments. ``build_parser`` imports them all, so their top-level imports stay light: numpy,
msgspec, onnxruntime, OpenCV, LiteRT and our modules that import those are imported inside the
handlers, and ``edgeinfer --help`` imports none of them (tests/test_cli.py checks).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ..version import __version__
from ..errors import EdgeInferError
from . import (
    bench_cmd,
    cmd_cmd,
    collect_cmd,
    config_cmds,
    fleet_cmd,
    model_cmds,
    ota_cmds,
    quantize_cmd,
    reload_cmd,
    run_cmd,
    watch_cmd,
)


class Verb(NamedTuple):
    """A verb of the command line."""

    help: str  # the line `edgeinfer --help` shows for it
    add_arguments: Callable[[argparse.ArgumentParser], None]  # its description and options
    handler: Callable[[argparse.Namespace], int]  # returns the exit code


# In the order `edgeinfer --help` lists them; each family's functions live in its own module.
VERBS: dict[str, Verb] = {
    "run": Verb("run the pipelines of a config", run_cmd.add_run_arguments, run_cmd.cmd_run),
    "demo": Verb("run the demo pipeline on a sample video", run_cmd.add_demo_arguments,
                 run_cmd.cmd_demo),
    "info": Verb("load a model and describe it", model_cmds.add_info_arguments,
                 model_cmds.cmd_info),
    "providers": Verb("list execution providers and delegates",
                      model_cmds.add_providers_arguments, model_cmds.cmd_providers),
    "models": Verb("list or pull the example models", model_cmds.add_models_arguments,
                   model_cmds.cmd_models),
    "validate-config": Verb("check a config file", config_cmds.add_validate_arguments,
                            config_cmds.cmd_validate),
    "watch": Verb("print devices' results and status from MQTT", watch_cmd.add_watch_arguments,
                  watch_cmd.cmd_watch),
    "collect": Verb("write a fleet's results, events and status into PostgreSQL (collect extra)",
                    collect_cmd.add_collect_arguments, collect_cmd.cmd_collect),
    "fleet": Verb("list the devices on a broker from their retained status",
                  fleet_cmd.add_fleet_arguments, fleet_cmd.cmd_fleet),
    "bench": Verb("measure a model's candidate backends (latency, memory, accuracy)",
                  bench_cmd.add_bench_arguments, bench_cmd.cmd_bench),
    "quantize": Verb("INT8-quantize an ONNX model with calibration data, with an accuracy report",
                     quantize_cmd.add_quantize_arguments, quantize_cmd.cmd_quantize),
    "keygen": Verb("make an Ed25519 key pair for signing models", ota_cmds.add_keygen_arguments,
                   ota_cmds.cmd_keygen),
    "push-model": Verb("push a signed model to devices over MQTT (or roll one back)",
                       ota_cmds.add_push_model_arguments, ota_cmds.cmd_push_model),
    "cmd": Verb("send a device a command (signed with --key)", cmd_cmd.add_cmd_arguments,
                cmd_cmd.cmd_cmd),
    "reload": Verb("make a running daemon reload its config and wait for the outcome",
                   reload_cmd.add_reload_arguments, reload_cmd.cmd_reload),
}

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgeinfer",
        description="On-device inference for embedded Linux: INT8 ONNX and TFLite models on "
        "verified providers, with bounded memory.",
    )
    parser.add_argument("--version", action="version", version=f"edgeinfer {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks for unexpected errors")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for name, verb in VERBS.items():
        verb.add_arguments(sub.add_parser(name, help=verb.help))
    return parser


class JournalFormatter(logging.Formatter):
    """``<N>name: message`` with the syslog priority journald reads from a stream's line start
    (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug); journald adds timestamps."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        prefix = f"<{_syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in text.splitlines())


def _syslog_priority(levelno: int) -> int:
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    return 6 if levelno >= logging.INFO else 7


def setup_logging(verbosity: int) -> None:
    level = logging.WARNING - 10 * min(verbosity, 2)
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):  # under systemd: journald stamps and levels the lines
        handler.setFormatter(JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return 2
    setup_logging(args.verbose)
    try:
        return int(VERBS[args.verb].handler(args) or 0)
    except EdgeInferError as exc:
        print(f"edgeinfer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as exc:  # never a bare traceback for a user; --debug shows it
        if args.debug:
            raise
        print(f"edgeinfer: internal error: {type(exc).__name__}: {exc} "
              "(run with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
