"""Whether a valid config can start here: the files it names, and what it would run.

A config that parses and validates may still not start on this machine: a model file that is
missing or a directory, an OTA public key file that does not exist, a TLS file that is gone, no
pipelines at all, a video (images, audio) file that is not there; a camera or serial device
that does not exist is reported too (the pipeline starts and waits for it).
``edgeinfer validate-config`` reports these (``--strict`` fails on them) and ``edgeinfer run``
refuses those that keep it from starting, with the same messages, before it opens anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..model.catalog import CATALOG, resolve_model
from ..config import Config
from ..errors import ConfigError, ModelError
from ..keys import load_trusted_keys
from ..runtime.modelfile import inspect_model

__all__ = ["StartProblem", "start_problems"]


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
    """

    where: str
    message: str
    fatal: bool = True
    waits: bool = False

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


def start_problems(config: Config) -> list[StartProblem]:
    """Everything about ``config`` that keeps it (or one of its pipelines) from starting here.

    Example models named by their catalog name that are not fetched yet are no problem: ``run``
    fetches them.
    """
    problems: list[StartProblem] = []
    if not config.pipelines:
        problems.append(StartProblem("$.pipelines", "no pipelines: `edgeinfer run` would have "
                                     "nothing to start"))
    problems += _tls_problems(config)
    problems += _ota_problems(config)
    models = [(i, _model_problem(config, i)) for i in range(len(config.pipelines))]
    bad = [(i, msg) for i, msg in models if msg is not None]
    # An update the OTA store holds may stand in for a missing configured model: with an ota:
    # section the daemon decides, so these only fail the start without one.
    all_bad = bool(config.pipelines) and len(bad) == len(config.pipelines)
    for i, msg in bad:
        pc = config.pipelines[i]
        fatal = config.ota is None and (pc.required or all_bad)
        problems.append(StartProblem(f"$.pipelines[{i}].model.path",
                                     f"pipeline {pc.name!r}: {msg}", fatal=fatal))
    for i, pc in enumerate(config.pipelines):
        found = _source_problem(pc.source)
        if found is not None:
            key, msg, file_missing = found
            # A missing file stops the pipeline from starting (a required one stops the
            # daemon); a missing device does not: the source retries until it appears.
            problems.append(StartProblem(f"$.pipelines[{i}].source.{key}",
                                         f"pipeline {pc.name!r}: {msg}",
                                         fatal=file_missing and pc.required,
                                         waits=not file_missing))
    return problems


def _source_problem(source: msgspec.Struct) -> tuple[str, str, bool] | None:
    """(config key, message, whether it is a file the source needs at start) for a source
    file or device that does not exist here; ``None`` when there is none to check."""
    tag = type(source).__struct_config__.tag
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
    elif tag in ("video", "audio"):
        key = "uri" if tag == "video" else "path"
        path = getattr(source, key, None)
        if path is not None and not Path(path).is_file():
            what = "not a file" if Path(path).exists() else f"no such {tag} file"
            return key, f"{what}: {path}", True
    elif tag == "images":
        uri = str(getattr(source, "uri", ""))
        if not any(c in uri for c in "*?[") and not Path(uri).exists():
            return "uri", f"no such folder or image file: {uri}", True
    return None


def _model_problem(config: Config, index: int) -> str | None:
    mc = config.pipelines[index].model
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
