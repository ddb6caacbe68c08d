"""Quantization itself, with onnxruntime's tooling, and its output: the INT8 model written to a
temporary file next to ``output``, loaded, run and measured against the float model
(``accuracy.measure``), then renamed into place with its model card, so a failure leaves no
partial file. ``run.quantize_model`` decides the settings this carries out.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..version import __version__
from ..errors import ConfigError, ModelError
from ..model.model import Model
from ..runtime.modelfile import ModelFileInfo, inspect_model
from ..tasks.base import Task
from .accuracy import Stages, load_feeds, measure
from .graph import op_types

if TYPE_CHECKING:
    import onnx

__all__ = ["CALIBRATION_WINDOW", "CARD_FORMAT", "METHODS", "ModelCard", "Progress", "peak_rss_mib",
           "task_tag", "write_quantized"]

logger = logging.getLogger("edgeinfer.quantize")  # its name before the package; users filter on it

Progress = Callable[[int, int], None]

METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
"""Calibration methods: ours, onnxruntime's ``CalibrationMethod`` names."""

CARD_FORMAT = "edgeinfer-model-card/1"

CALIBRATION_WINDOW = 4
"""Calibration samples onnxruntime's calibrator holds at once. Its histogram calibrators
(percentile, entropy) run a copy of the model that outputs every tensor they calibrate and keep
those outputs for all the samples they are given in one go (``CalibStridedMinMax`` gives them
windows) before reducing them to histograms: YOLOv8n-320's are about 57 MB a sample, and 100
samples at once peaked at 6.4 GiB. Measured on that model (40 samples, 84 held-out crops):
all at once 2,742 MiB, windows of 4 451 MiB, of 1 361 MiB, the same mAP against float within one
box and the same CPU time for 4 and 1 (after the first window numpy bins by sorting: about 2x
the CPU of all at once, the price of the bound). 4 rather than 1: the first window sets the
histograms' bin width, and one sample is a thin basis for it."""


@dataclass(frozen=True, slots=True)
class ModelCard:
    """What ``quantize_model`` wrote: the model, its card and the accuracy report.

    Attributes:
        path: The quantized model.
        card_path: The model card JSON next to it (``<output stem>.card.json``).
        data: The whole card (see ``docs/quantize.md`` for its fields).
    """

    path: Path
    card_path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def report(self) -> dict[str, Any]:
        """The accuracy report against the float model."""
        report: dict[str, Any] = self.data.get("report") or {}
        return report

    @property
    def passed(self) -> bool | None:
        """Whether the report's checks pass (``None`` where the task's report does not judge:
        only detect's does, on recall at its threshold and score drift; and where it rests on
        too little to judge, verdict ``insufficient``: see the report's ``more_data``)."""
        verdict = self.report.get("verdict")
        return None if verdict not in ("pass", "fail") else verdict == "pass"

    @property
    def warnings(self) -> list[str]:
        """Warnings raised while quantizing (few samples, skipped files, ...)."""
        return list(self.data.get("warnings") or [])

    def to_dict(self) -> dict[str, Any]:
        """The card as written to ``card_path``."""
        return dict(self.data)


def task_tag(task_cfg: Any) -> str:
    """The tag of a task config struct (``detect``, ``raw``, ...), as the card names it."""
    return str(type(task_cfg).__struct_config__.tag)


def write_quantized(src: Path, info: ModelFileInfo, out: Path, float_model: Model, task: Task,
                    task_cfg: Any, calib: list[Path], held: list[Path],
                    data_card: dict[str, Any], settings: dict[str, Any], warnings: list[str],
                    load_opts: dict[str, Any], progress: Progress | None, work: Path,
                    proto: onnx.ModelProto, stages: Stages) -> ModelCard:
    """Quantize ``proto`` (the prepared graph of ``src``, named, in ``work``) as ``settings``
    say, calibrating on ``calib`` (spooled samples), measure it on ``held`` and write it to
    ``out`` with its card; nothing is left at ``out`` or beside it when any step fails.
    ``stages`` hears each stage (calibrating, quantizing, evaluating...)."""
    import onnx

    card_path = out.with_suffix(".card.json")
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.stem}.", suffix=".partial.onnx")
    # mkstemp makes it 0600: a model is no secret, and the service (systemd DynamicUser=) must
    # read it. The mode a new file gets here (0644 under the usual umask 022).
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp = Path(tmp_name)
    card_tmp = card_path.with_name(f".{card_path.name}.partial")
    try:
        named = work / "named.onnx"
        onnx.save(proto, str(named))
        t0 = time.monotonic()
        if settings["mode"] == "static":
            names = [s.name for s in float_model.inputs]
            _quantize_static(named, tmp, proto, calib, names, settings, progress, stages)
        else:
            stages("quantizing (dynamic)", 0, 0)
            _quantize_dynamic(named, tmp, proto, settings)
        elapsed = time.monotonic() - t0
        card = _card(src, info, tmp, out, float_model, task, task_cfg, held, data_card,
                     settings, warnings, load_opts, elapsed, stages)
        card_tmp.write_text(_dumps(card), encoding="utf-8")
        os.replace(tmp, out)
        os.replace(card_tmp, card_path)
    except BaseException:
        for p in (tmp, card_tmp):
            p.unlink(missing_ok=True)
        raise
    logger.info("quantized %s -> %s (%s)", src, out, card["output"]["quantization"])
    return ModelCard(out, card_path, card)


def _dumps(card: dict[str, Any]) -> str:
    return json.dumps(card, indent=2, default=str) + "\n"


class _Reader:
    """Hands onnxruntime's calibrator one spooled sample at a time, read from its file when
    asked, in windows of ``window`` samples (``set_range``, which ``CalibStridedMinMax`` calls):
    the calibrator keeps the outputs of a window only."""

    def __init__(self, feeds: Sequence[Path], names: Sequence[str], window: int,
                 progress: Progress | None, stages: Stages) -> None:
        self._feeds, self._names, self._window = feeds, names, window
        self._progress, self._stages = progress, stages
        self._next, self._end = 0, len(feeds)
        self._told = False

    def __len__(self) -> int:
        # onnxruntime wants the length a multiple of the window; the last window is shorter
        # (never empty: the padding is less than a window)
        return -(-len(self._feeds) // self._window) * self._window

    def set_range(self, start_index: int, end_index: int) -> None:
        self._next, self._end = start_index, min(end_index, len(self._feeds))

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= self._end:
            if self._next >= len(self._feeds) and not self._told:
                self._told = True
                self._stages("computing activation ranges, writing the INT8 graph", 0, 0)
            return None
        feeds = load_feeds(self._feeds[self._next])
        self._next += 1
        if self._progress is not None:
            self._progress(self._next, len(self._feeds))
        self._stages("calibrating", self._next, len(self._feeds))
        return {k: feeds[k] for k in self._names if k in feeds}

    def rewind(self) -> None:
        self._next, self._end = 0, len(self._feeds)


def _quantize_static(named: Path, tmp: Path, proto: onnx.ModelProto, calib: Sequence[Path],
                     names: Sequence[str], settings: dict[str, Any], progress: Progress | None,
                     stages: Stages) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static, registry)

    allowed = set(registry.QDQRegistry) | set(registry.QLinearOpsRegistry)
    ops = op_types(proto, allowed, [*settings["exclude_types"], *settings["float_types"]],
                    named.name, "static")
    # onnxruntime is imported here, not at the top, so its reader base class is mixed in here.
    reader = type("CalibrationReader", (_Reader, CalibrationDataReader), {})(
        calib, names, CALIBRATION_WINDOW, progress, stages)
    stages("calibrating", 0, len(calib))
    chatter = io.StringIO()  # the percentile/entropy calibrators print() their progress
    try:
        with contextlib.redirect_stdout(chatter):
            quantize_static(
                str(named), str(tmp), reader, quant_format=QuantFormat.QDQ,
                op_types_to_quantize=ops, per_channel=settings["per_channel"],
                reduce_range=settings["reduce_range"],
                activation_type=getattr(QuantType, settings["activation_type"]),
                weight_type=getattr(QuantType, settings["weight_type"]),
                nodes_to_exclude=_float_nodes(settings),
                calibrate_method=getattr(CalibrationMethod, METHODS[settings["method"]]),
                extra_options={"CalibStridedMinMax": CALIBRATION_WINDOW},
            )
    except (ModelError, ConfigError):
        raise
    except Exception as exc:  # onnxruntime's tooling raises whatever it meets
        raise ModelError(f"static quantization failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if chatter.getvalue():
            logger.debug("onnxruntime calibration: %s", chatter.getvalue().strip())


def _float_nodes(settings: dict[str, Any]) -> list[str]:
    """Every node the settings keep in float: excluded, output writers, the decode head."""
    return [*settings["exclude_nodes"], *settings["float_outputs"], *settings["float_head"]]


def peak_rss_mib() -> int:
    """This process's peak resident memory so far, in MiB (``getrusage``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1048576 if sys.platform == "darwin" else 1024))


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` sets it, racing threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


# ConvInteger, what dynamic quantization makes of a Conv, has CPU kernels for uint8 weights only:
# with int8 weights the model would not load. Convolutions stay float in dynamic mode.
_DYNAMIC_SKIP = frozenset({"Conv"})


def _quantize_dynamic(named: Path, tmp: Path, proto: onnx.ModelProto,
                      settings: dict[str, Any]) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic, registry

    allowed = set(registry.IntegerOpsRegistry) - _DYNAMIC_SKIP
    ops = op_types(proto, allowed, settings["exclude_types"], named.name, "dynamic",
                    subgraphs=True)
    try:
        quantize_dynamic(str(named), str(tmp), op_types_to_quantize=ops,
                         per_channel=settings["per_channel"],
                         reduce_range=settings["reduce_range"],
                         weight_type=getattr(QuantType, settings["weight_type"]),
                         nodes_to_exclude=_float_nodes(settings),
                         extra_options={"EnableSubgraph": True})
    except (ModelError, ConfigError):
        raise
    except Exception as exc:
        raise ModelError(f"dynamic quantization failed: {type(exc).__name__}: {exc}") from exc


def _card(src: Path, info: ModelFileInfo, tmp: Path, out: Path, float_model: Model, task: Task,
          task_cfg: Any, held: list[Path], data_card: dict[str, Any], settings: dict[str, Any],
          warnings: list[str], load_opts: dict[str, Any], elapsed: float, stages: Stages
          ) -> dict[str, Any]:
    """Check, load, run and measure the quantized model, and describe it all."""
    import msgspec
    import onnx
    import onnxruntime

    q_info = inspect_model(tmp)
    quantization = q_info.onnx.quantization if q_info.onnx else "unknown"
    if quantization == "float":
        raise ModelError(f"nothing in {src.name} was quantized (every quantizable node is "
                         "excluded?)")
    stages("loading the INT8 model", 0, 0)
    report = measure(tmp, float_model, task, held, load_opts, stages)
    # The verdict and its failures are the report's (the CLI prints them once); logged at info
    for why in report.get("failures") or ():
        logger.info("the INT8 model fails the accuracy check: %s", why)
    if report.get("more_data"):
        logger.info("%s", report["more_data"])
    return {
        "format": CARD_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "input": {"path": str(src), "sha256": info.sha256, "size_bytes": info.size_bytes,
                  "quantization": "float"},
        "output": {"path": str(out), "sha256": q_info.sha256, "size_bytes": q_info.size_bytes,
                   "quantization": quantization},
        "size_ratio": round(q_info.size_bytes / max(info.size_bytes, 1), 4),
        "settings": settings,
        "task": {"type": task_tag(task_cfg), "config": msgspec.to_builtins(task_cfg)},
        **data_card,
        "runtime": {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__,
                    "edgeinfer": __version__, "machine": platform.machine(),
                    "quantize_s": round(elapsed, 2), "peak_rss_mib": peak_rss_mib()},
        "report": report,
        "warnings": warnings,
    }
