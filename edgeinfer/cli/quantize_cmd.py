"""``edgeinfer quantize IN OUT``: INT8 quantization with a model card and an accuracy table."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..errors import ModelError
from .model_cmds import model_inputs

__all__ = ["add_quantize_arguments", "cmd_quantize", "format_card"]


def _names(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class _Bar:
    """A text progress bar on stderr, redrawn at most ten times a second."""

    def __init__(self, label: str, width: int = 30) -> None:
        self.label, self.width = label, width
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.width * done // max(total, 1)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] "
                         f"{done}/{total}")
        if done >= total:
            sys.stderr.write("\n")
        sys.stderr.flush()
        self._drawn = done < total

    def close(self) -> None:
        if self._drawn:  # an error cut it short: end the line before the message
            sys.stderr.write("\n")
            self._drawn = False


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
    from ..quantize import quantize_model  # inside: numpy, msgspec, cv2

    shapes = model_inputs(args.input, args.input_shape)[0]
    bar = _Bar("calibrating") if sys.stderr.isatty() or not args.json else None
    try:
        card = quantize_model(
            args.input, args.output, args.calibration, config=args.config,
            pipeline=args.pipeline, mode=args.mode, target=args.target, method=args.method,
            per_channel=args.per_channel, exclude_nodes=_names(args.exclude_nodes),
            exclude_types=_names(args.exclude_types), exclude_first_conv=args.exclude_first_conv,
            exclude_head=args.exclude_head, quantize_head=args.quantize_head,
            samples=args.samples, held_out=args.held_out,
            force=args.force, progress=bar, input_shapes=shapes,
        )
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        sys.stdout.write(json.dumps(card.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(format_card(card.to_dict()))
    if card.passed is False:  # written for inspection; a script must not ship it as good
        sys.stderr.write(f"edgeinfer: error: {args.output} fails the accuracy check against "
                         f"the float model: {'; '.join(card.report['failures'])} (see its card "
                         f"{card.card_path})\n")
        return ModelError.exit_code
    return 0


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
    lines = [f"{label:<13} {value}" for label, value in rows]
    lines += [f"warning       {w}" for w in card.get("warnings") or []]
    return "\n".join(lines) + "\n"


def _report_rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    if not r.get("samples"):
        return [("accuracy", r.get("note", "not measured"))]
    from ..tasks import task_for_gate  # inside: numpy, not for --help

    rows = task_for_gate(r["kind"]).accuracy_rows(r)
    if "verdict" in r:  # any task's checks: a failed one fails the model
        rows.append(("verdict", "pass" if r["verdict"] == "pass"
                     else "FAIL: " + "; ".join(r["failures"])))
    return rows
