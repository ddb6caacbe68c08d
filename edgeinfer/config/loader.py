"""Load a YAML config file into the typed `Config`, with errors that name the path and the line.

Messages read ``<file>:<line>: <path>: <problem>``, the path as msgspec writes it::

    config.yaml:12: $.pipelines[0].model.threads: expected int, got str

See `edgeinfer.config._yaml` for ``${VAR}``, ``${VAR:-default}``, ``${credential:NAME}`` and
``$$`` in values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from ..errors import ConfigError
from ._yaml import YamlReader, format_path
from .messages import MSGSPEC_AT, validation_error
from .pipeline import (
    BUILT_IN_TASKS,
    BUILTIN_LABELS,
    TASK_CONFIGS,
    AudioSource,
    ImagesSource,
    JsonlSink,
    PendingTask,
    SourceConfig,
    TaskOptions,
    VideoSource,
)
from .schema import Config, PipelineConfig

T = TypeVar("T")

__all__ = ["config_schema", "load_config", "parse_config"]

_Path = tuple[str | int, ...]

# A video or images `uri` with a scheme (file://, http://) is not a path relative to the config.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def load_config(path: str | os.PathLike[str], *, stand_in_credentials: bool = False) -> Config:
    """Read and validate a config file.

    ``stand_in_credentials``: a ``${credential:NAME}`` that cannot be read here (outside the
    service, where ``$CREDENTIALS_DIRECTORY`` is not set) becomes a placeholder instead of an
    error; for reading what a config does without its secrets (``--systemd-dropin``).

    Relative paths are taken from the folder the file is in: model paths,
    ``runtime.state_dir``/``cache_dir``, a ``video``/``images`` source's ``uri`` (unless it is a
    URL), an ``audio`` source's ``path``, a ``jsonl`` sink's ``path``, a labels file,
    ``mqtt.tls``'s ``ca_file``/``cert_file``/``key_file`` and ``mqtt.outbox.path``. A
    ``camera`` source's ``uri`` is left as written.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, or does not validate.
    """
    file = Path(path)
    text = _read(file)
    return parse_config(text, source=str(file), base_dir=file.parent.absolute(),
                        stand_in_credentials=stand_in_credentials)


def parse_config(text: str, *, source: str = "<string>", base_dir: Path | None = None,
                 stand_in_credentials: bool = False) -> Config:
    """Validate config text (YAML).

    Args:
        text: The YAML document.
        source: Names the text in error messages (a file name).
        base_dir: Folder relative paths are taken from; the working directory when ``None``.

    Raises:
        ConfigError: invalid YAML, a failed substitution, or a value that does not validate.
    """
    reader = YamlReader(source, stand_in_credentials=stand_in_credentials)
    try:
        data = reader.load(text)
    except RecursionError:
        raise ConfigError(f"{source}: config nested too deeply") from None
    except ConfigError as exc:  # a list at the top: a list of pipelines saved alone?
        lone = _lone_pipelines(source, _plain_yaml(text))
        if lone is not None:
            raise lone from None
        raise exc from None
    lone = _lone_pipelines(source, data)
    if lone is not None:
        raise lone
    _check_unique_names(reader, data)
    try:
        config = _convert(data)
    except msgspec.ValidationError as exc:
        error = validation_error(reader, exc, data)
        if not reader.has_secrets:
            raise error from exc
    else:
        return _resolve_paths(config, base_dir if base_dir is not None else Path.cwd())
    # msgspec's own message may quote a credential's value: raised here, outside the handler,
    # the error carries no __context__ holding it.
    raise error


# Keys only a pipeline has: a file whose top level is made of them is a pipeline saved alone.
_DEVICE_ONLY = frozenset(Config.__struct_fields__)
_PIPELINE_ONLY = frozenset(PipelineConfig.__struct_fields__) - _DEVICE_ONLY


def _lone_pipelines(source: str, data: Any) -> ConfigError | None:
    """The error for a pipeline (or a list of pipelines) saved as a file of its own, as the
    docs show them, showing where it goes; ``None`` for anything else."""
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(item, dict) and not set(item) & _DEVICE_ONLY
                            and len(set(item) & _PIPELINE_ONLY) >= 2 for item in items):
        return None
    lines = ["pipelines:"]
    for item in items[:2]:
        keys = [k for k in item if k in _PIPELINE_ONLY] or list(item)
        for j, key in enumerate(keys[:4]):
            value = item[key] if key == "name" and isinstance(item[key], str) else "..."
            lines.append(("  - " if j == 0 else "    ") + f"{key}: {value}")
    if len(items) > 2:
        lines.append("  - ...")
    what = ("a list of pipelines" if isinstance(data, list) and len(items) > 1
            else "one pipeline")
    shape = "\n".join(f"    {line}" for line in lines)
    return ConfigError(
        f"{source}: this is {what}, not a whole config: a config lists its pipelines under "
        f"`pipelines:` (and may add mqtt:, runtime:, ...). Indent it under that key, each "
        f"pipeline starting with `- `:\n{shape}\n(docs/configuration.md)")


def _plain_yaml(text: str) -> Any:
    """``text`` as plain YAML data, or ``None`` when it is not (only to recognise a shape)."""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):  # the reader's own error stands
        return None


def _convert(data: Any) -> Config:
    """``data`` as a `Config`: the registered (plug-in) tasks converted on their own around
    the tree, which msgspec decodes with the built-in ones (see `OpenUnion`)."""
    registered = _take_registered_tasks(data)
    config = msgspec.convert(data, Config, strict=True)
    if not registered:
        return config
    pipelines = list(config.pipelines)
    for i, task in registered.items():
        try:  # the pipeline's own checks run again, with its task: called here, as the
            # msgspec releases pyproject admits differ on whether replace() runs them
            pipelines[i] = msgspec.structs.replace(pipelines[i], task=task)
            pipelines[i].__post_init__()
        except ValueError as exc:
            raise msgspec.ValidationError(f"{exc} - at `$.pipelines[{i}]`") from None
    return msgspec.structs.replace(config, pipelines=pipelines)


def _take_registered_tasks(data: Any) -> dict[int, TaskOptions]:
    """Convert each pipeline's ``task:`` of a type not built in against `TASK_CONFIGS` (an
    unknown type is refused there, naming the valid ones), leaving a `PendingTask` in the data.

    Raises:
        msgspec.ValidationError: a task does not validate; the path is the task's in the file.
    """
    pipelines = data.get("pipelines") if isinstance(data, dict) else None
    taken: dict[int, TaskOptions] = {}
    for i, pipeline in enumerate(pipelines if isinstance(pipelines, list) else []):
        task = pipeline.get("task") if isinstance(pipeline, dict) else None
        tag = task.get("type") if isinstance(task, dict) else None
        if not isinstance(tag, str) or tag in BUILT_IN_TASKS:
            continue  # msgspec decodes it in the tree, or says what is wrong with it
        try:
            taken[i] = msgspec.convert(task, TASK_CONFIGS.union(), strict=True)
        except msgspec.ValidationError as exc:
            raise _inside(exc, f"$.pipelines[{i}].task") from None
        pipeline["task"] = {"type": PendingTask.__struct_config__.tag}
    return taken


def _inside(exc: msgspec.ValidationError, at: str) -> msgspec.ValidationError:
    """``exc`` of a value converted on its own, with its path put inside ``at``."""
    match = MSGSPEC_AT.match(str(exc))
    if match is None:  # the value itself
        return msgspec.ValidationError(f"{exc} - at `{at}`")
    key = "key` in `" if match["key"] else ""
    return msgspec.ValidationError(f"{match['msg']} - at `{key}{at}{match['path'][1:]}`")


def load_struct(path: str | os.PathLike[str], root: type[T]) -> T:
    """Read a YAML file of another config tree (``collect.yaml``: `CollectConfig`) with the
    same rules as the device config: substitutions, credentials, errors naming the line and
    the path.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML, or does not validate.
    """
    file = Path(path)
    text = _read(file)
    reader = YamlReader(str(file))
    try:
        data = reader.load(text)
    except RecursionError:
        raise ConfigError(f"{file}: config nested too deeply") from None
    try:
        return msgspec.convert(data, root, strict=True)
    except msgspec.ValidationError as exc:
        error = validation_error(reader, exc, data, root)
    raise error  # outside the handler: no __context__ holding a credential's value


_COLLECT_KEYS = re.compile(r"^(database|source)\s*:", re.M)
# A device config's keys, and a pipeline's saved alone (its `source:` is not a collector's:
# `load_config` says where it goes).
_DEVICE_KEYS = re.compile(r"^(pipelines|mqtt|device|runtime|name|model|task|sinks)\s*:", re.M)


def config_kind(path: str | os.PathLike[str]) -> str:
    """``collect`` for a collector config (top-level ``database:``/``source:`` and none of a
    device config's keys), else ``device``.

    Raises:
        ConfigError: the file cannot be read.
    """
    text = _read(Path(path))
    if _COLLECT_KEYS.search(text) and not _DEVICE_KEYS.search(text):
        return "collect"
    return "device"


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror or exc}") from exc


def config_schema() -> dict[str, Any]:
    """The JSON schema of `Config`, for documentation and editors (``task:`` with the task
    types registered now)."""
    tasks = TASK_CONFIGS.union()
    (root, task), defs = msgspec.json.schema_components([Config, tasks],
                                                        ref_template="#/$defs/{name}")
    defs["PipelineConfig"]["properties"]["task"] = task  # msgspec sees the open field as Any
    return {**root, "$defs": defs}


def _resolve_paths(config: Config, base: Path) -> Config:
    def absolute(p: str) -> str:
        # normpath, not resolve(): a model behind the store's `current` link must stay behind it.
        return os.path.normpath(os.path.join(base, os.path.expanduser(p)))

    replace = msgspec.structs.replace
    runtime = config.runtime
    runtime = replace(
        runtime,
        state_dir=absolute(runtime.state_dir) if runtime.state_dir else None,
        cache_dir=absolute(runtime.cache_dir) if runtime.cache_dir else None,
    )
    pipelines = [
        replace(
            p,
            model=replace(p.model, path=absolute(p.model.path)),
            source=_resolve_source(p.source, absolute),
            task=_resolve_task(p.task, absolute),
            sinks=[
                replace(s, path=absolute(s.path)) if isinstance(s, JsonlSink) else s
                for s in p.sinks
            ],
        )
        for p in config.pipelines
    ]
    mqtt = config.mqtt
    if mqtt is not None:
        tls = mqtt.tls
        if tls is not None:
            tls = replace(tls, **{name: absolute(getattr(tls, name))
                                  for name in ("ca_file", "cert_file", "key_file")
                                  if getattr(tls, name)})
        outbox = mqtt.outbox
        if outbox.path:
            outbox = replace(outbox, path=absolute(outbox.path))
        mqtt = replace(mqtt, tls=tls, outbox=outbox)
    ota = config.ota
    if ota is not None:  # key files relative to the config; inline "ed25519:..." keys as written
        ota = replace(ota, trusted_keys=[k if k.lstrip().startswith(("ed25519:", "-----"))
                                         else absolute(k) for k in ota.trusted_keys])
    http = config.http
    if http is not None and http.tls is not None:
        http = replace(http, tls=replace(http.tls, cert_file=absolute(http.tls.cert_file),
                                         key_file=absolute(http.tls.key_file)))
    return replace(config, runtime=runtime, pipelines=pipelines, mqtt=mqtt, ota=ota, http=http)


def _resolve_source(source: SourceConfig, absolute: Callable[[str], str]) -> SourceConfig:
    # Not a camera's uri: an index, a device path or a stream URL, each meant as written.
    if isinstance(source, (VideoSource, ImagesSource)) and not _URL.match(source.uri):
        return msgspec.structs.replace(source, uri=absolute(source.uri))
    if isinstance(source, AudioSource) and source.path is not None:
        return msgspec.structs.replace(source, path=absolute(source.path))
    return source


def _resolve_task(task: TaskOptions, absolute: Callable[[str], str]) -> TaskOptions:
    labels = getattr(task, "labels", None)  # any task's labels file (a list stays as it is)
    if isinstance(labels, str) and labels not in BUILTIN_LABELS:
        return msgspec.structs.replace(task, labels=absolute(labels))
    return task


def _check_unique_names(reader: YamlReader, data: Any) -> None:
    """Report a duplicate pipeline name at the second one (before msgspec, for the line)."""
    pipelines = data.get("pipelines") if isinstance(data, dict) else None
    first: dict[str, int] = {}
    for i, pipeline in enumerate(pipelines if isinstance(pipelines, list) else []):
        name = pipeline.get("name") if isinstance(pipeline, dict) else None
        if not isinstance(name, str):
            continue
        j = first.setdefault(name, i)
        if j != i:
            here: _Path = ("pipelines", i, "name")
            there: _Path = ("pipelines", j, "name")
            msg = f"duplicate pipeline name {name!r} (first at {format_path(there)}"
            msg += f", line {reader.lines[there]})" if there in reader.lines else ")"
            raise reader.error(here, reader.lines.get(here), msg)
