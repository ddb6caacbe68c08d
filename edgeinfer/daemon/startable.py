"""Whether a valid config can start here: the one check `validate-config` and `run` share.

A config that parses and validates may still not start on this machine: a model file that is
missing or a directory, an OTA public key file that does not exist, a TLS file that is gone, no
pipelines at all, a video (images, audio) file that is not there, a labels file that cannot be
read, an audio command whose program is not installed, PyAV (a camera that needs it), picamera2
or amqtt (an embedded broker) missing; a camera or serial device that does not exist is
reported too (the pipeline starts and waits for it). Some are wrong on any machine: a task
setting no task has, an ``mqtt`` sink or source without the ``mqtt:`` section, a zone outside
the frame, an embedded broker with TLS or off loopback without a password, signed commands
without ``ota.trusted_keys``.

``edgeinfer validate-config`` reports these (``--strict`` fails on those tied to this machine),
``edgeinfer run`` refuses those that keep it from starting, with the same messages, before it
opens anything, and the daemon leaves out a pipeline with one (`pipeline_problems`) before it
loads its model: everything ``run`` checks before it loads a model or opens a device is checked
here (whether the model fits its task needs the model: checked when the pipeline starts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..config import AudioSource, CameraSource, Config, PipelineConfig
from ..config.pipeline import BUILTIN_LABELS
from ..control.link import signed_commands_problem
from ..errors import ConfigError, ModelError, SourceError
from ..keys import load_trusted_keys
from ..model.catalog import CATALOG, resolve_model
from ..model.samples import is_demo_clip
from ..mqtt.embedded import EmbeddedBroker, amqtt_missing
from ..pipeline.build import frame_size_problems
from ..runtime.modelfile import inspect_model
from ..sources.audio import command_problem
from ..sources.cameras import camera_reader
from ..sources.picamera import module_problem
from ..tasks import load_labels, task_class

__all__ = ["StartProblem", "pipeline_problems", "start_problems"]


@dataclass(frozen=True, slots=True)
class StartProblem:
    """One reason a config would not start (or, with ``fatal`` False, would start only in part).

    Attributes:
        where: The config path it is about, e.g. ``$.pipelines[0].model.path``.
        message: What is wrong, naming the file.
        fatal: ``edgeinfer run`` refuses the whole config; False for a pipeline that would be
            skipped while others start.
        waits: The pipeline starts anyway and waits for it (a camera or serial device that is
            not plugged in).
        invalid: Wrong on any machine (``validate-config`` fails on it without ``--strict``).
        stops: The pipeline it is about does not start with it (the daemon leaves it out).
    """

    where: str
    message: str
    fatal: bool = True
    waits: bool = False
    invalid: bool = False
    stops: bool = False

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def start_problems(config: Config) -> list[StartProblem]:
    """Everything about ``config`` that keeps it (or one of its pipelines) from starting here.

    A problem of a pipeline is fatal when the pipeline is ``required`` or when no pipeline
    would start. Example models named by their catalog name that are not fetched yet are no
    problem (``run`` fetches them), nor is a missing ``demo.mp4`` (the demo clip).
    """
    problems: list[StartProblem] = []
    if not config.pipelines:
        problems.append(StartProblem("$.pipelines", "no pipelines: `edgeinfer run` would have "
                                     "nothing to start"))
    problems += _tls_problems(config)
    problems += _ota_problems(config)
    problems += _mqtt_problems(config)
    found = [pipeline_problems(config, pc) for pc in config.pipelines]
    stopped = [any(p.stops for p in ps) for ps in found]
    none_starts = bool(stopped) and all(stopped)
    for pc, ps in zip(config.pipelines, found, strict=True):
        problems += [dataclasses.replace(p, fatal=p.stops and (pc.required or none_starts))
                     for p in ps]
    return problems


def pipeline_problems(config: Config, pc: PipelineConfig) -> list[StartProblem]:
    """What keeps pipeline ``pc`` of ``config`` from starting here, found without loading its
    model or opening its source (``fatal`` is left False: see `start_problems`)."""
    index = next((i for i, p in enumerate(config.pipelines) if p.name == pc.name), 0)
    at, who = f"$.pipelines[{index}]", f"pipeline {pc.name!r}: "
    problems: list[StartProblem] = []

    def add(key: str, message: str, **facts: bool) -> None:
        problems.append(StartProblem(f"{at}.{key}", who + message, fatal=False, **facts))

    problem = task_class(str(type(pc.task).__struct_config__.tag)).check_config(pc.task)
    if problem:  # worded as the task words it: "decoder: unknown decoder 'yolo'; valid: ..."
        key, _, why = problem.partition(": ")
        problems.append(StartProblem(f"{at}.task.{key}", why, fatal=False, invalid=True,
                                     stops=True))
    labels = getattr(pc.task, "labels", None)
    if isinstance(labels, str) and labels not in BUILTIN_LABELS:
        try:
            load_labels(labels)  # as the task reads it, once the model is loaded
        except ConfigError as exc:
            add("task.labels", str(exc), stops=True)
    model = _model_problem(config, pc)
    if model is not None:
        # An update the OTA store holds may stand in for a missing configured model: with an
        # ota: section the daemon decides.
        add("model.path", model, stops=config.ota is None)
    source = _source_problem(pc.source)
    if source is not None:
        key, message, file_missing = source
        # A missing file or program stops the pipeline from starting; a missing device does
        # not: the source retries until it appears.
        add(f"source.{key}", message, stops=file_missing, waits=not file_missing)
    parts = [("source", "source", pc.source),
             *((f"sinks[{i}]", "sink", sink) for i, sink in enumerate(pc.sinks))]
    for key, kind, part in parts:
        for section in getattr(part, "needs_sections", ()):
            if getattr(config, section, None) is None:
                tag = type(part).__struct_config__.tag
                example = _SECTIONS.get(section, "")
                add(key, f"the {tag} {kind} needs the {section}: section: add one at the top "
                    f"level ({example}docs/configuration.md) or use another {kind} type",
                    invalid=True, stops=True)
    for key, message in frame_size_problems(pc):
        add(key, message, invalid=True, stops=True)
    return problems


# What a section that a part needs looks like at its smallest, for the message.
_SECTIONS = {"mqtt": "`mqtt: {host: 127.0.0.1}`, "}


def _source_problem(source: msgspec.Struct) -> tuple[str, str, bool] | None:
    """(config key, message, whether the source cannot start without it) for a source file,
    device or program that is not here; ``None`` when there is none to check."""
    tag = type(source).__struct_config__.tag
    if isinstance(source, CameraSource):
        try:
            camera_reader(source)  # as the start picks it: PyAV when the config needs it
        except SourceError as exc:
            return "backend", str(exc).removeprefix("camera: "), True
    if tag == "camera" and getattr(source, "backend", "") != "gstreamer":
        uri = getattr(source, "uri", "")
        node = f"/dev/video{int(uri)}" if isinstance(uri, int) or uri.isdigit() else uri
        if node.startswith("/dev/") and not Path(node).exists():
            return "uri", (f"no such device {node}: is the camera plugged in? `ls /dev/video*` "
                           "(the pipeline starts without it and retries until it appears)"), False
    elif tag == "serial":
        port = str(getattr(source, "port", ""))
        if not Path(port).exists():
            return "port", (f"no such device {port}: is the sensor plugged in? "
                            "`ls /dev/tty*` (the pipeline retries until it appears)"), False
    elif tag == "picamera2":
        missing = module_problem()
        if missing is not None:
            return "type", missing, True
    elif isinstance(source, AudioSource) and source.command is not None:
        problem = command_problem(source)
        if problem is not None:
            return "command", problem, True
    elif tag in ("video", "audio"):
        key = "uri" if tag == "video" else "path"
        path = getattr(source, key, None)
        if tag == "video" and path is not None and is_demo_clip(path):
            return None  # `run` plays the demo clip (made in the samples cache)
        if path is not None and not Path(path).is_file():
            what = "not a file" if Path(path).exists() else f"no such {tag} file"
            return key, f"{what}: {path}", True
    elif tag == "images":
        uri = str(getattr(source, "uri", ""))
        if not any(c in uri for c in "*?[") and not Path(uri).exists():
            return "uri", f"no such folder or image file: {uri}", True
    return None


def _model_problem(config: Config, pc: PipelineConfig) -> str | None:
    mc = pc.model
    path = mc.path
    try:
        found = resolve_model(path, fetch_missing=False)
    except ModelError as exc:
        if Path(path).name in {n for e in CATALOG.values() for n in (e.name, e.filename)}:
            return None  # an example model: `run` pulls it
        return str(exc)
    if found.is_dir():
        return f"model path {found} is a directory, not a model file"
    try:
        inspect_model(found, max_model_mb=mc.max_model_mb or config.runtime.max_model_mb,
                      digest=False)
    except ModelError as exc:
        return str(exc)
    return None


def _tls_problems(config: Config) -> list[StartProblem]:
    sections = [("mqtt", config.mqtt.tls if config.mqtt is not None else None),
                ("http", config.http.tls if config.http is not None else None)]
    problems = []
    for section, tls in sections:
        for name in ("ca_file", "cert_file", "key_file"):
            value = getattr(tls, name, None)
            if value and not Path(value).is_file():
                what = "no such file" if not Path(value).exists() else "not a file"
                problems.append(StartProblem(f"$.{section}.tls.{name}", f"{what}: {value}"))
    return problems


def _mqtt_problems(config: Config) -> list[StartProblem]:
    """The embedded broker the daemon would start (its settings, amqtt installed) and signed
    commands with no keys to check them: refused by the start before any pipeline."""
    mqtt = config.mqtt
    if mqtt is None:
        return []
    problems = []
    if mqtt.embedded:
        try:
            EmbeddedBroker.from_config(mqtt)  # what the start builds: it checks its settings
        except ConfigError as exc:
            problems.append(StartProblem("$.mqtt", str(exc).removeprefix("mqtt: "),
                                         invalid=True))
        missing = amqtt_missing()
        if missing is not None:
            problems.append(StartProblem("$.mqtt.embedded", missing))
    signed = signed_commands_problem(config)
    if signed is not None:
        problems.append(StartProblem("$.mqtt.commands.signed", signed, invalid=True))
    return problems


def _ota_problems(config: Config) -> list[StartProblem]:
    if config.ota is None:
        return []
    try:
        load_trusted_keys(config.ota.trusted_keys)
    except ConfigError as exc:
        where, sep, message = str(exc).partition(": ")
        if not (sep and where.startswith("ota.trusted_keys")):
            where, message = "ota.trusted_keys", str(exc)
        return [StartProblem(f"$.{where}", f"{message} (make one with `edgeinfer keygen`, see "
                             "docs/ota.md, or delete the ota: section)")]
    return []
