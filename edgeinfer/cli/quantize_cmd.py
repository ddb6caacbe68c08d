"""``edgeinfer quantize IN OUT``: INT8 quantization with a model card and an accuracy table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from ..errors import ConfigError, ModelError
from .model_cmds import model_inputs

__all__ = ["add_quantize_arguments", "cmd_quantize", "format_card"]


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class _Stages:
    """What ``edgeinfer quantize`` is doing, on stderr from its first second: one line per stage,
    with the seconds since the start; a counted stage (calibrating 37/100) redrawn in place at
    most ten times a second on a terminal, and in a pipe or a log one line at most every
    ``every`` seconds and at its end (no carriage returns)."""

    def __init__(self, stream: TextIO, every: float = 5.0) -> None:
        self._out, self._every = stream, every
        self._tty = stream.isatty()
        self._t0 = time.monotonic()
        self._stage = ""
        self._last = 0.0
        self._open = False  # a redrawn line is on the terminal without its newline

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        new = stage != self._stage
        if not new and (done == 0 or (done < total and now - self._last
                                      < (0.1 if self._tty else self._every))):
            return
        self._stage, self._last = stage, now
        count = f" {done}/{total}" if total else ""
        text = f"[{now - self._t0:5.1f} s] {stage}{count}"
        if self._tty and total and done < total:
            self._out.write(f"\r{text}\x1b[K")
            self._open = True
        else:
            redraw = self._tty and self._open and not new
            self._out.write(("\r" if redraw else "\n" if self._open else "") + text
                            + ("\x1b[K\n" if redraw else "\n"))
            self._open = False
        self._out.flush()

    def close(self) -> None:
        if self._open:  # an error cut a redrawn line short: end it before the message
            self._out.write("\n")
            self._out.flush()
            self._open = False


def add_quantize_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Static INT8 quantization (QDQ, per-channel weights) of an ONNX model, "
                     "calibrated on data preprocessed exactly as the pipeline does; dynamic "
                     "quantization for recurrent models. Writes OUT, a model card OUT.card.json "
                     "with an accuracy report against the float model, and prints the report.")
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
    p.add_argument("--quantize-head", action="store_true",
                   help="quantize the decode head too (a Concat/Sigmoid/Softmax after the last "
                   "convolutions stays float by default: quantized, scores drift)")
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


def cmd_quantize(args: argparse.Namespace) -> int:
    stages = _Stages(sys.stderr)
    stages("loading", 0, 0)  # before the imports below: onnxruntime, cv2 take seconds
    from ..quantize import quantize_model  # inside: numpy, msgspec, cv2

    shapes = model_inputs(args.input, args.input_shape)[0]
    try:
        card = quantize_model(
            args.input, args.output, args.calibration, config=args.config,
            pipeline=args.pipeline, mode=args.mode, target=args.target, method=args.method,
            per_channel=args.per_channel, exclude_nodes=_names(args.exclude_nodes),
            exclude_types=_names(args.exclude_types), exclude_first_conv=args.exclude_first_conv,
            exclude_head=args.exclude_head, quantize_head=args.quantize_head,
            samples=args.samples, held_out=args.held_out,
            force=args.force, input_shapes=shapes, stages=stages,
        )
    finally:
        stages.close()
    stages(f"done: peak memory {card.data['runtime']['peak_rss_mib']} MiB", 0, 0)
    if args.json:
        sys.stdout.write(json.dumps(card.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(format_card(card.to_dict()))
    return _exit(card, args)


def _exit(card: Any, args: argparse.Namespace) -> int:
    """The exit code, and the one error line a failed or unjudged model gets; the reasons are
    in the table's verdict row (printed once), or in this line under ``--json``."""
    report = card.report
    verdict = report.get("verdict")
    if verdict not in ("fail", "insufficient"):
        return 0
    # written for inspection either way; a script must not ship it as good
    if verdict == "fail":
        why = "; ".join(report["failures"]) if args.json else "the verdict above"
        sys.stderr.write(f"edgeinfer: error: {args.output} fails the accuracy check against "
                         f"the float model ({why}; its card {card.card_path})\n")
        return ModelError.exit_code
    why = report["more_data"] if args.json else "the verdict above"
    sys.stderr.write(f"edgeinfer: error: {args.output} is written but not judged: too little "
                     f"evidence for the accuracy check ({why}; its card {card.card_path})\n")
    return ConfigError.exit_code


def format_card(card: dict[str, Any]) -> str:
    """The card as a readable table: files, settings, data, then the accuracy report."""
    s, inp, out = card["settings"], card["input"], card["output"]
    rows = [
        ("input", f"{inp['path']}  ({inp['size_bytes'] / 1048576:.2f} MiB, float)"),
        ("output", f"{out['path']}  ({out['size_bytes'] / 1048576:.2f} MiB, "
                   f"{out['quantization']}, {card['size_ratio']:.0%} of the input)"),
        ("card", card.get("card_path") or out["path"].rsplit(".", 1)[0] + ".card.json"),
        ("mode", f"{s['mode']} ({s['format']}), target {s['target']}: activations "
                 f"{s['activation_type']}, weights {s['weight_type']}"
                 + (", 7-bit weights" if s.get("reduce_range") else "")
                 + (", per channel" if s["per_channel"] else ", per tensor")),
    ]
    if s["mode"] == "static":
        rows.append(("calibration", f"{s['method']} on {card['calibration']['count']} samples "
                                    f"({card['calibration']['kind']}: "
                                    f"{card['calibration']['source']})"))
    excluded = len(s["exclude_nodes"])
    head = len(s.get("float_head") or ())
    if excluded or s["exclude_types"] or head:
        kept = ", ".join(part for part in (
            f"{excluded} nodes" if excluded else "",
            f"types {', '.join(s['exclude_types'])}" if s["exclude_types"] else "",
            f"the decode head ({head} nodes)" if head else "") if part)
        rows.append(("kept float", kept))
    if s.get("opset_upgrade"):
        rows.append(("opset", s["opset_upgrade"]))
    held = card.get("held_out")
    if held:
        rows.append(("held out", f"{held['count']} samples, {held['from']}"))
    rows += _report_rows(card["report"])
    run = card.get("runtime") or {}
    if run.get("peak_rss_mib") is not None:
        rows.append(("resources", f"calibrating and quantizing {run['quantize_s']:.1f} s; "
                                  f"peak memory of the run {run['peak_rss_mib']} MiB"))
    lines = [f"{label:<13} {value}" for label, value in rows]
    lines += [f"warning       {w}" for w in card.get("warnings") or []]
    return "\n".join(lines) + "\n"


def _report_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    if not r.get("samples"):
        return [("accuracy", r.get("note", "not measured"))]
    from ..tasks import task_for_gate  # inside: numpy, not for --help

    rows = task_for_gate(r["kind"]).accuracy_rows(r)
    if "verdict" in r:  # any task's checks: a failed one fails the model
        rows.append(("verdict", _verdict(r)))
    return rows


def _verdict(r: dict[str, Any]) -> str:
    evidence = r.get("evidence") or {}
    basis = (f" (on {evidence['count']} {evidence['unit']} in {r['samples']} inputs)"
             if evidence else f" (on {r['samples']} inputs)")
    if r["verdict"] == "insufficient":
        return f"NOT JUDGED: {r['more_data']}"
    if r["verdict"] == "pass":
        return "pass" + basis
    return "FAIL" + basis + ": " + "; ".join(r["failures"])
