"""Whether a valid config can start here: the files it names, and what it would run.

A config that parses and validates may still not start on this machine: a model file that is
missing or a directory, an OTA public key file that does not exist, a TLS file that is gone, no
pipelines at all. ``edgeinfer validate-config`` reports these (``--strict`` fails on them) and
``edgeinfer run`` refuses with the same messages before it opens anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, ModelError
from ..keys import load_trusted_keys
from .schema import Config

__all__ = ["StartProblem", "start_problems"]


@dataclass(frozen=True, slots=True)
class StartProblem:
    """One reason a config would not start (or, with ``fatal`` False, would start only in part).

    Attributes:
        where: The config path it is about, e.g. ``$.pipelines[0].model.path``.
        message: What is wrong, naming the file.
        fatal: ``edgeinfer run`` refuses the whole config; False for a pipeline that would be
            skipped while others start.
    """

    where: str
    message: str
    fatal: bool = True

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
    return problems


def _model_problem(config: Config, index: int) -> str | None:
    from ..catalog import CATALOG, resolve_model
    from ..runtime.modelfile import inspect_model

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
